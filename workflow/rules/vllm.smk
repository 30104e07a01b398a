# Benchmarks through vLLM: serial latency (max_num_seqs=1) and batched throughput
# (max_num_seqs=16). Each job holds the baseline's engine and the method's and times them
# alternately (serial: prompt by prompt; batched: ABBA rounds of the whole batch).
# {engine}: vllm (vLLM's implementation of the method) or vllm_specdec (our own proposer inside
# vLLM, through its custom proposer hook: vllm.specdec_proposers).


wildcard_constraints:
    mode="serial|batched",
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
        prompts=dataset_prompts,
        code=VLLM_SOURCES,
        method_code=lambda wc: method_sources(wc.method),  # its vLLM mapping
        export=vllm_export,
    output:
        records="{root}/{engine}/{mode}/{dataset}/{method}-{variant}.jsonl",
        summary="{root}/{engine}/{mode}/{dataset}/{method}-{variant}.summary.json",
    params:
        target=target_dir,
        model=vllm_model_arg,
        method_params=method_params,
        limit=lambda wc: bench_setting(wc.dataset, config["vllm"]["dtype"], "prompts", "vllm"),
        max_new=lambda wc: bench_setting(wc.dataset, config["vllm"]["dtype"], "max_new_tokens", "vllm"),
        proposer=lambda wc: "specdec" if wc.engine == "vllm_specdec" else "vllm",
        engine=vllm_engine_args,
        sampling=sampling_args,
        resamples=config["bench"].get("bootstrap_resamples", 10000),
    threads: rule_threads("bench_vllm")
    resources:
        **rule_resources("bench_vllm"),
    conda:
        CONDA_ENV
    log:
        "logs/bench_vllm/{root}/{engine}-{mode}-{dataset}-{method}-{variant}.log",
    benchmark:
        "benchmarks/bench_vllm/{root}/{engine}-{mode}-{dataset}-{method}-{variant}.tsv"
    shell:
        "python -m specdec bench-vllm --target {params.target} --prompts {input.prompts}"
        " --dataset {wildcards.dataset} --method {wildcards.method} --variant {wildcards.variant} {params.model}"
        " --params '{params.method_params}' --mode {wildcards.mode} --proposer {params.proposer}"
        " --limit {params.limit} --max-new-tokens {params.max_new} {params.engine} --resamples {params.resamples}"
        " {params.sampling}"
        " --out-records {output.records} --out-summary {output.summary} > {log} 2>&1"
