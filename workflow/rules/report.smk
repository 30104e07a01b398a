# Aggregation: results/rows.parquet, results/tables.md, the plots and the README's results
# section; and the reproducibility check, results/drift.md, from a second benchmark pass. No job
# writes README.md or docs/: `specdec publish`, run after the DAG, copies these outputs there.


rule report:
    input:
        summaries=PLAN.torch_summaries() + PLAN.vllm_summaries(),
        checkpoints=PLAN.trained_checkpoints(),
        cost_curve="results/costs/cost_curve.json",
        code=code("report"),
        method_code=PLAN.all_method_sources(),  # the report reads each method's module (registry)
    output:
        rows="results/rows.parquet",
        tables="results/tables.md",
        cost_table="results/cost_curve.md",
        cost_plot=report("results/plots/cost_curve.png", caption="../report/cost_curve.rst", category="Results",
                         labels={"figure": "cost curve", "backend": "torch", "dataset": "all"}),
        section="results/readme_section.md",
        speedup=report("results/plots/speedup.png", caption="../report/speedup.rst", category="Results",
                       labels={"figure": "speedup", "backend": "all", "dataset": "all"}),
        throughput=report("results/plots/throughput.png", caption="../report/throughput.rst", category="Results",
                          labels={"figure": "throughput", "backend": "all", "dataset": "all"}),
        acceptance=report("results/plots/acceptance_by_position.png", caption="../report/acceptance.rst",
                          category="Results", labels={"figure": "acceptance by position", "backend": "all",
                                                      "dataset": "all"}),
        csv=report("results/rows.csv", caption="../report/rows.rst", category="Tables",
                   labels={"table": "every row (CSV)", "backend": "all", "dataset": "all"}),
        html=report("results/rows.html", caption="../report/rows.rst", category="Tables",
                    labels={"table": "every row", "backend": "all", "dataset": "all"}),
    params:
        configs=lambda wc, input: " ".join(os.path.dirname(p) for p in input.checkpoints),
        sizing=PLAN.sizing_note(),
    threads: rule_threads("report")
    resources:
        **rule_resources("report"),
    conda:
        CONDA_ENV
    log:
        "logs/report/report.log",
    benchmark:
        "benchmarks/report/report.tsv"
    shell:
        "python -m specdec report --summaries {input.summaries} --out-tables {output.tables} --out-rows {output.rows}"
        " --out-csv {output.csv} --out-html {output.html}"
        " --checkpoints {params.configs} --sizing {params.sizing:q}"
        " --cost-curve {input.cost_curve} --out-cost-table {output.cost_table}"
        " --plots-dir results/plots --readme-section {output.section} > {log} 2>&1"


# `snakemake results/learning_curve.md --cores 1` (opt-in, about 10 minutes on the default): the
# train.learning_curve checkpoint trained again on fewer records with the same steps, and its
# held-out accuracy against training-set size
rule learning_curve:
    input:
        checkpoints=lambda wc: PLAN.learning_curve_checkpoints(),
        code=code("learning-curve"),
        method_code=lambda wc: PLAN.learning_curve_sources(),  # the report reads its method's module
    output:
        table="results/learning_curve.md",
        plot=report("results/plots/learning_curve.png", caption="../report/learning_curve.rst", category="Results",
                    labels={"figure": "learning curve", "backend": "torch", "dataset": "chat_heldout"}),
    params:
        dirs=lambda wc, input: " ".join(os.path.dirname(p) for p in input.checkpoints),
    threads: rule_threads("learning_curve")
    resources:
        **rule_resources("learning_curve"),
    conda:
        CONDA_ENV
    log:
        "logs/learning_curve/learning_curve.log",
    benchmark:
        "benchmarks/learning_curve/learning_curve.tsv"
    shell:
        "python -m specdec learning-curve --checkpoints {params.dirs} --out-table {output.table}"
        " --out-plot {output.plot} > {log} 2>&1"


# `snakemake docs/ablation.md --cores 1` (opt-in): train.ablation's checkpoints, one per change to
# the drafters' training (the reference-reply rows on a chat set and hidden-state cache of their
# own), decoded on the held-out prompts in one bench-torch job; the table and plot go to docs/
use rule bench_torch as ablation_bench with:
    input:
        target=TARGET,
        prompts=DATASET_FILES["chat_heldout"],
        code=code("bench-torch"),
        method_code=lambda wc: PLAN.ablation_sources(),
        checkpoints=lambda wc: PLAN.ablation_checkpoints(),
        spec=job_spec("ablation_bench", "dtype", "dataset"),
    output:
        records="results/ablation/{dtype}/{dataset}.jsonl",
        summary="results/ablation/{dtype}/{dataset}.summary.json",
    params:   # merged into bench_torch's params by keyword
        merged="",
        aa="",
        tuned="",
        limit=config["train"].get("ablation", {}).get("prompts"),
        max_new=config["train"].get("ablation", {}).get("max_new_tokens"),
    log:
        "logs/ablation_bench/{dtype}-{dataset}.log",
    benchmark:
        "benchmarks/ablation_bench/{dtype}-{dataset}.tsv"


rule ablation:
    input:
        summary="results/ablation/auto/chat_heldout.summary.json",
        checkpoints=lambda wc: PLAN.ablation_checkpoints(),
        code=code("ablation"),
        spec=job_spec("ablation"),
    output:
        table="docs/ablation.md",
        plot="docs/ablation.png",
    threads: rule_threads("report")
    resources:
        **rule_resources("report"),
    conda:
        CONDA_ENV
    log:
        "logs/ablation/ablation.log",
    benchmark:
        "benchmarks/ablation/ablation.tsv"
    shell:
        "python -m specdec ablation --spec {input.spec} --summary {input.summary}"
        " --out-table {output.table} --out-plot {output.plot} > {log} 2>&1"


# `snakemake results/drift.md --cores 1`: every benchmark job again into results/rerun/ (the
# trained checkpoints and data are reused), then the per-row drift of the speedups
rule drift:
    input:
        first=PLAN.torch_summaries() + PLAN.vllm_summaries(),
        second=PLAN.torch_summaries("results/rerun") + PLAN.vllm_summaries("results/rerun"),
        code=code("drift"),
    output:
        "results/drift.md",
    threads: rule_threads("drift")
    resources:
        **rule_resources("drift"),
    conda:
        CONDA_ENV
    log:
        "logs/drift/drift.log",
    benchmark:
        "benchmarks/drift/drift.tsv"
    shell:
        "python -m specdec drift --first {input.first} --second {input.second} --out {output} > {log} 2>&1"
