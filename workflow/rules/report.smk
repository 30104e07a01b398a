# Aggregation: results/tables.md, the plots and the README's results section.


rule report:
    input:
        summaries=torch_method_summaries() + vllm_summaries(),
        checkpoints=trained_checkpoints(),
        code=[str(SRC / "report" / "tables.py"), str(SRC / "report" / "plots.py")],
    output:
        tables="results/tables.md",
        section="results/readme_section.md",
        plots=multiext("results/plots/", "speedup.png", "throughput.png", "acceptance_by_position.png"),
    params:
        configs=lambda wc, input: " ".join(os.path.dirname(p) for p in input.checkpoints),
        readme=f"--readme {config['report']['readme']}" if config["report"]["readme"] else "",
    conda:
        CONDA_ENV
    log:
        "logs/report/report.log",
    shell:
        "python -m specdec report --summaries {input.summaries} --out-tables {output.tables}"
        " --checkpoints {params.configs} --plots-dir results/plots --readme-section {output.section} {params.readme} > {log} 2>&1"
