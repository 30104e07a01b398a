# Benchmarks through vLLM: serial latency (max_num_seqs=1) and batched throughput
# (max_num_seqs=16), each with its own shared baseline engine run per data set.


wildcard_constraints:
    mode="serial|batched",


rule bench_vllm_baseline:
    input:
        target=TARGET,
        prompts=lambda wc: DATASET_FILES[wc.dataset],
        code=VLLM_SOURCES,
    output:
        records="results/vllm/{mode}/{dataset}/baseline.jsonl",
        summary="results/vllm/{mode}/{dataset}/baseline.summary.json",
    params:
        target=target_dir,
        limit=lambda wc: bench_setting(wc.dataset)["prompts"],
        max_new=lambda wc: max_new_tokens(wc.dataset, config["vllm"]["dtype"]),
        engine=vllm_engine_args,
    conda:
        CONDA_ENV
    log:
        "logs/bench_vllm_baseline/{mode}-{dataset}.log",
    shell:
        "python -m specdec bench-vllm --target {params.target} --prompts {input.prompts}"
        " --dataset {wildcards.dataset} --method baseline --mode {wildcards.mode} --limit {params.limit}"
        " --max-new-tokens {params.max_new} {params.engine}"
        " --out-records {output.records} --out-summary {output.summary} > {log} 2>&1"


rule export_vllm:
    input:
        checkpoint="checkpoints/{method}/{name}/manifest.json",
        target=TARGET,
        code=lambda wc: method_sources(wc.method),
    output:
        "checkpoints/vllm_exports/{method}-{name}/manifest.json",
    params:
        target=target_dir,
    conda:
        CONDA_ENV
    log:
        "logs/export_vllm/{method}-{name}.log",
    shell:
        "python -m specdec export-vllm --method {wildcards.method} --checkpoint checkpoints/{wildcards.method}/{wildcards.name}"
        " --target {params.target} --out checkpoints/vllm_exports/{wildcards.method}-{wildcards.name} > {log} 2>&1"


rule bench_vllm_method:
    input:
        target=TARGET,
        prompts=lambda wc: DATASET_FILES[wc.dataset],
        baseline="results/vllm/{mode}/{dataset}/baseline.jsonl",
        code=VLLM_SOURCES,
        export=vllm_export,
    output:
        records="results/vllm/{mode}/{dataset}/{method}-{variant}.jsonl",
        summary="results/vllm/{mode}/{dataset}/{method}-{variant}.summary.json",
    params:
        target=target_dir,
        model=vllm_model_arg,
        method_params=method_params,
        limit=lambda wc: bench_setting(wc.dataset)["prompts"],
        max_new=lambda wc: max_new_tokens(wc.dataset, config["vllm"]["dtype"]),
        engine=vllm_engine_args,
    conda:
        CONDA_ENV
    log:
        "logs/bench_vllm_method/{mode}-{dataset}-{method}-{variant}.log",
    shell:
        "python -m specdec bench-vllm --target {params.target} --prompts {input.prompts}"
        " --dataset {wildcards.dataset} --method {wildcards.method} --variant {wildcards.variant} {params.model}"
        " --params '{params.method_params}' --mode {wildcards.mode} --baseline {input.baseline}"
        " --limit {params.limit} --max-new-tokens {params.max_new} {params.engine}"
        " --out-records {output.records} --out-summary {output.summary} > {log} 2>&1"
