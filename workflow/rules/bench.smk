# Benchmarks with our PyTorch loop. One shared greedy baseline per (dtype, data set); every method
# and Hugging Face peer is compared against it on the same prompts.


wildcard_constraints:
    dtype="float32|bfloat16|float16",
    dataset="chat_heldout|chat_overlap|wiki",
    method="[a-z][a-z0-9_]*",
    name="[A-Za-z0-9_.]+",
    variant="[A-Za-z0-9_.]+",


rule bench_torch_baseline:
    input:
        target=TARGET,
        prompts=lambda wc: DATASET_FILES[wc.dataset],
        code=CORE_SOURCES,
    output:
        records="results/torch/{dtype}/{dataset}/baseline.jsonl",
        summary="results/torch/{dtype}/{dataset}/baseline.summary.json",
    params:
        target=target_dir,
        limit=lambda wc: bench_setting(wc.dataset)["prompts"],
        max_new=lambda wc: max_new_tokens(wc.dataset, wc.dtype),
        warmup=config["bench"]["warmup_prompts"],
        device=config["device"],
        threads=config["threads"],
    conda:
        CONDA_ENV
    log:
        "logs/bench_torch_baseline/{dtype}-{dataset}.log",
    shell:
        "python -m specdec bench-torch --target {params.target} --prompts {input.prompts} --dataset {wildcards.dataset}"
        " --method baseline --limit {params.limit} --max-new-tokens {params.max_new}"
        " --warmup {params.warmup} --dtype {wildcards.dtype} --device {params.device}"
        " --threads {params.threads} --out-records {output.records} --out-summary {output.summary}"
        " 2>&1 | tee {log}"


rule bench_torch_method:
    input:
        target=TARGET,
        prompts=lambda wc: DATASET_FILES[wc.dataset],
        baseline="results/torch/{dtype}/{dataset}/baseline.jsonl",
        code=CORE_SOURCES,
        method_code=lambda wc: method_sources(wc.method),
        checkpoint=method_checkpoint,
    output:
        records="results/torch/{dtype}/{dataset}/{method}-{variant}.jsonl",
        summary="results/torch/{dtype}/{dataset}/{method}-{variant}.summary.json",
    params:
        target=target_dir,
        method_params=method_params,
        counterpart=counterpart_args,
        limit=lambda wc: bench_setting(wc.dataset)["prompts"],
        max_new=lambda wc: max_new_tokens(wc.dataset, wc.dtype),
        warmup=config["bench"]["warmup_prompts"],
        device=config["device"],
        threads=config["threads"],
    conda:
        CONDA_ENV
    log:
        "logs/bench_torch_method/{dtype}-{dataset}-{method}-{variant}.log",
    shell:
        "python -m specdec bench-torch --target {params.target} --prompts {input.prompts} --dataset {wildcards.dataset}"
        " --method {wildcards.method} --variant {wildcards.variant} --params '{params.method_params}'"
        " {params.counterpart}"
        " --baseline {input.baseline} --limit {params.limit} --max-new-tokens {params.max_new}"
        " --warmup {params.warmup} --dtype {wildcards.dtype} --device {params.device}"
        " --threads {params.threads} --out-records {output.records} --out-summary {output.summary}"
        " 2>&1 | tee {log}"
