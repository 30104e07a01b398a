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
        max_new=lambda wc: bench_setting(wc.dataset)["max_new_tokens"],
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


rule bench_vllm_method:
    input:
        target=TARGET,
        prompts=lambda wc: DATASET_FILES[wc.dataset],
        baseline="results/vllm/{mode}/{dataset}/baseline.jsonl",
        code=VLLM_SOURCES,
    output:
        records="results/vllm/{mode}/{dataset}/{method}-{variant}.jsonl",
        summary="results/vllm/{mode}/{dataset}/{method}-{variant}.summary.json",
    params:
        target=target_dir,
        method_params=method_params,
        limit=lambda wc: bench_setting(wc.dataset)["prompts"],
        max_new=lambda wc: bench_setting(wc.dataset)["max_new_tokens"],
        engine=vllm_engine_args,
    conda:
        CONDA_ENV
    log:
        "logs/bench_vllm_method/{mode}-{dataset}-{method}-{variant}.log",
    shell:
        "python -m specdec bench-vllm --target {params.target} --prompts {input.prompts}"
        " --dataset {wildcards.dataset} --method {wildcards.method} --variant {wildcards.variant}"
        " --params '{params.method_params}' --mode {wildcards.mode} --baseline {input.baseline}"
        " --limit {params.limit} --max-new-tokens {params.max_new} {params.engine}"
        " --out-records {output.records} --out-summary {output.summary} > {log} 2>&1"
