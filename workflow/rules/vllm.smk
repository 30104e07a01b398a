# Benchmarks through vLLM: serial latency (one request in flight) and batched throughput (up to
# 16). One job per method variant runs all its rows (data sets x modes): it starts the baseline's
# engine and the method's once and times them alternately on each row (serial: prompt by prompt;
# batched: ABBA rounds of the whole batch).
# {engine}: vllm (vLLM's implementation of the method) or vllm_specdec (our own proposer inside
# vLLM, through its custom proposer hook: vllm.specdec_proposers).


wildcard_constraints:
    engine="vllm|vllm_specdec",


rule export_vllm:
    input:
        checkpoint="checkpoints/{method}/{name}/manifest.json",
        target=TARGET,
        code=lambda wc: method_sources(wc.method),
    output:
        "checkpoints/vllm_exports/{method}-{name}/manifest.json",
    params:
        target=target_dir,
    threads: rule_threads("export_vllm")
    resources:
        **rule_resources("export_vllm"),
    conda:
        CONDA_ENV
    log:
        "logs/export_vllm/{method}-{name}.log",
    benchmark:
        "benchmarks/export_vllm/{method}-{name}.tsv",
    shell:
        "python -m specdec export-vllm --method {wildcards.method} --checkpoint checkpoints/{wildcards.method}/{wildcards.name}"
        " --target {params.target} --out checkpoints/vllm_exports/{wildcards.method}-{wildcards.name} > {log} 2>&1"


rule bench_vllm:
    input:
        target=TARGET,
        prompts=vllm_job_prompts,
        code=VLLM_SOURCES,
        method_code=lambda wc: method_sources(wc.method),  # its vLLM mapping
        export=vllm_export,
    output:
        records="{root}/{engine}/{method}-{variant}.jsonl",
        summary="{root}/{engine}/{method}-{variant}.summary.json",
    params:
        target=target_dir,
        model=vllm_model_arg,
        method_params=method_params,
        rows=vllm_rows_arg,
        proposer=lambda wc: "specdec" if wc.engine == "vllm_specdec" else "vllm",
        engine=vllm_engine_args,
        resamples=config["bench"].get("bootstrap_resamples", 10000),
    threads: rule_threads("bench_vllm")
    resources:
        **rule_resources("bench_vllm"),
    conda:
        CONDA_ENV
    log:
        "logs/bench_vllm/{root}/{engine}-{method}-{variant}.log",
    benchmark:
        "benchmarks/bench_vllm/{root}/{engine}-{method}-{variant}.tsv"
    shell:
        "python -m specdec bench-vllm --target {params.target} --method {wildcards.method}"
        " --variant {wildcards.variant} {params.model} --params '{params.method_params}'"
        " --rows '{params.rows}' --proposer {params.proposer} {params.engine} --resamples {params.resamples}"
        " --out-records {output.records} --out-summary {output.summary} > {log} 2>&1"
