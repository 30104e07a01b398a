# Benchmarks through vLLM: serial latency (one request in flight) and batched throughput (up to
# 16). One job per prompt set runs every vLLM row drawn from it (data sets x modes): it starts the
# baseline's engine and one engine per arm once (vLLM's implementation of a method, or our own
# proposer inside vLLM through its custom proposer hook: vllm.specdec_proposers), and times them
# all on each row in a rotating order (serial: prompt by prompt; batched: round by round); with
# the engines in the job's process (vllm.in_process) their steps interleave. vllm.aa_control adds
# a second baseline engine as an arm: the A/A row.
# vllm.jobs "arm" runs one job per arm instead (all its data sets), each with its own baseline engine.


wildcard_constraints:
    job="|".join(re.escape(job) for job in VLLM_JOBS) or "(?!)",


rule export_vllm:
    input:
        checkpoint="checkpoints/{method}/{name}/manifest.json",
        target=TARGET,
        code=code("export-vllm"),
        method_code=lambda wc: PLAN.method_sources(wc.method),
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
        prompts=lambda wc: PLAN.vllm_job_prompts(wc.job),
        code=code("bench-vllm"),
        method_code=lambda wc: PLAN.vllm_job_sources(wc.job),  # their vLLM mappings
        exports=lambda wc: PLAN.vllm_job_exports(wc.job),
        spec=job_spec("bench_vllm", "job"),
    output:
        records="{root}/vllm/{job}.jsonl",
        summary="{root}/vllm/{job}.summary.json",
    params:
        target=target_dir,
        engine=lambda wc: PLAN.vllm_engine_args(wc.job),
        resamples=config["bench"].get("bootstrap_resamples", 10000),
    threads: rule_threads("bench_vllm")
    resources:
        **rule_resources("bench_vllm"),
    conda:
        CONDA_ENV
    log:
        "logs/bench_vllm/{root}/{job}.log",
    benchmark:
        "benchmarks/bench_vllm/{root}/{job}.tsv"
    shell:
        "python -m specdec bench-vllm --target {params.target} --spec {input.spec}"
        " {params.engine} --resamples {params.resamples}"
        " --out-records {output.records} --out-summary {output.summary} > {log} 2>&1"
