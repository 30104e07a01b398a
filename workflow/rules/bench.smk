# Benchmarks with our PyTorch loop. One job per (dtype, data set) loads the target once and times
# every method configured there and one greedy baseline arm (and a Hugging Face peer's arm of ours)
# in one process, each prompt decoded by every arm in a rotating order: every speedup is paired,
# with a bootstrap interval over prompts. The baseline arm is also the reference for the
# token-by-token equality check. {root} is results/, or results/rerun/ for the drift check. Where a
# set is tuned (bench.datasets.X.tuning), a job also times the tuned variants chosen for it (rule
# tune_torch) beside the fixed ones.


wildcard_constraints:
    root="results|results/rerun",
    dtype="auto|float32|bfloat16|float16",
    dataset=BENCH_DATASETS,
    method="[a-z][a-z0-9_]*",
    name="[A-Za-z0-9_.]+",
    variant="[A-Za-z0-9_.]+",


rule bench_torch:
    input:
        target=TARGET,
        prompts=lambda wc: PLAN.dataset_prompts(wc.dataset),
        code=code("bench-torch"),
        method_code=lambda wc: PLAN.torch_job_sources(wc.dtype, wc.dataset),
        checkpoints=lambda wc: PLAN.torch_job_checkpoints(wc.dtype, wc.dataset),
        tools=lambda wc: PLAN.torch_job_tools(wc.dtype, wc.dataset),
        tuning=lambda wc: PLAN.torch_job_tuning(wc.dtype, wc.dataset),
        spec=job_spec("bench_torch", "dtype", "dataset"),
    output:
        records="{root}/torch/{dtype}/{dataset}.jsonl",
        summary="{root}/torch/{dtype}/{dataset}.summary.json",
    params:
        target=target_dir,
        merged=lambda wc: "--require-dtype float32" if PLAN.require_float32(wc.dtype, wc.dataset) else "",
        aa=lambda wc: "--aa-control" if config["bench"]["datasets"][wc.dataset].get("aa_control") else "",
        tuned=lambda wc, input: f"--tuned {input.tuning}" if input.tuning else "",
        limit=lambda wc: PLAN.bench_setting(wc.dataset, wc.dtype, "prompts"),
        max_new=lambda wc: PLAN.bench_setting(wc.dataset, wc.dtype, "max_new_tokens"),
        warmup=config["bench"]["warmup_prompts"],
        resamples=config["bench"].get("bootstrap_resamples", 10000),
        device=config["device"],
        threads=config["threads"],
    threads: rule_threads("bench_torch")
    resources:
        **rule_resources("bench_torch"),
    conda:
        CONDA_ENV
    log:
        "logs/bench_torch/{root}/{dtype}-{dataset}.log",
    benchmark:
        "benchmarks/bench_torch/{root}/{dtype}-{dataset}.tsv"
    shell:
        "python -m specdec bench-torch --target {params.target} --prompts {input.prompts} --dataset {wildcards.dataset}"
        " --spec {input.spec} --limit {params.limit} --max-new-tokens {params.max_new}"
        " --warmup {params.warmup} --resamples {params.resamples} --dtype {wildcards.dtype}"
        " --device {params.device} --threads {params.threads} {params.merged} {params.aa}"
        " {params.tuned} --out-records {output.records} --out-summary {output.summary} 2>&1 | tee {log}"


# Tuned variants: each variant of a PyTorch job whose method has a tuning grid, decoded with every
# candidate on the records of its prompt file after those any benchmark reads; the choices file
# names, per variant, the candidate its costs (the host's cost curve) predict fastest, which the
# job times beside it.
rule tune_torch:
    input:
        target=TARGET,
        prompts=lambda wc: PLAN.dataset_prompts(wc.dataset),
        code=code("tune-torch"),
        method_code=lambda wc: PLAN.torch_job_sources(wc.dtype, wc.dataset),
        checkpoints=lambda wc: PLAN.torch_job_checkpoints(wc.dtype, wc.dataset),
        cost_curve="results/costs/cost_curve.json",
        spec=job_spec("tune_torch", "dtype", "dataset"),
    output:
        choices="results/tuning/{dtype}/{dataset}.json",
        records="results/tuning/{dtype}/{dataset}.candidates.jsonl",
        summary="results/tuning/{dtype}/{dataset}.candidates.summary.json",
    params:
        target=target_dir,
        skip=lambda wc: PLAN.tuning_skip(wc.dataset),
        limit=lambda wc: PLAN.tuning(wc.dataset)["prompts"],
        max_new=lambda wc: PLAN.tuning(wc.dataset)["max_new_tokens"],
        warmup=config["bench"]["warmup_prompts"],
        resamples=config["bench"].get("bootstrap_resamples", 10000),
        device=config["device"],
        threads=config["threads"],
    threads: rule_threads("bench_torch")
    resources:
        **rule_resources("bench_torch"),
    conda:
        CONDA_ENV
    log:
        "logs/tune_torch/{dtype}-{dataset}.log",
    benchmark:
        "benchmarks/tune_torch/{dtype}-{dataset}.tsv"
    shell:
        "python -m specdec tune-torch --target {params.target} --prompts {input.prompts} --dataset {wildcards.dataset}"
        " --spec {input.spec} --skip {params.skip} --limit {params.limit} --max-new-tokens {params.max_new}"
        " --warmup {params.warmup} --resamples {params.resamples} --dtype {wildcards.dtype}"
        " --device {params.device} --threads {params.threads} --cost-curve {input.cost_curve}"
        " --out {output.choices} --out-records {output.records} --out-summary {output.summary} 2>&1 | tee {log}"


# The host's cost curve: the target's verification step of 1 to 16 nodes, chain and tree, at the
# context of each data set with a PyTorch job, in bench.cost_curve.dtypes and the benchmarks'; and the host's
# memory read bandwidth. The report checks every PyTorch row's speedup against it.
rule cost_curve:
    input:
        target=TARGET,
        prompts=sorted({s["prompts"] for s in PLAN.cost_curve_sets().values()}),
        code=code("cost-curve"),
        spec=job_spec("cost_curve"),
    output:
        "results/costs/cost_curve.json",
    params:
        target=target_dir,
        # the configured dtypes and every benchmark dtype, so that no PyTorch row goes unchecked
        dtypes=" ".join(dict.fromkeys(config["bench"]["cost_curve"]["dtypes"] + config["bench"]["dtypes"])),
        repeats=config["bench"]["cost_curve"]["repeats"],
        warmup=config["bench"]["cost_curve"]["warmup"],
        device=config["device"],
        threads=config["threads"],
    threads: rule_threads("bench_torch")
    resources:
        **rule_resources("bench_torch"),
    conda:
        CONDA_ENV
    log:
        "logs/cost_curve/cost_curve.log",
    benchmark:
        "benchmarks/cost_curve/cost_curve.tsv"
    shell:
        "python -m specdec cost-curve --target {params.target} --spec {input.spec} --dtypes {params.dtypes}"
        " --repeats {params.repeats} --warmup {params.warmup} --device {params.device} --threads {params.threads}"
        " --out {output} 2>&1 | tee {log}"
