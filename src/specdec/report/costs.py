"""What the DAG's jobs cost: Snakemake's `benchmark:` files (one TSV per job, `s` = wall seconds,
`max_rss` = peak MB) summed per rule. `specdec job-costs` prints the table; `specdec publish`,
run after the DAG, writes it into the README between its costs markers (the report job cannot:
its own benchmark file is written after it ends)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

START, END = "<!-- costs:start -->", "<!-- costs:end -->"


def job_costs(bench_dir: str) -> pd.DataFrame:
    files = sorted(Path(bench_dir).rglob("*.tsv"))
    if not files:
        raise ValueError(f"{bench_dir}: no Snakemake benchmark files (*.tsv)")
    jobs = pd.concat([pd.read_csv(f, sep="\t").assign(rule=f.relative_to(bench_dir).parts[0]) for f in files])
    costs = jobs.groupby("rule").agg(jobs=("s", "size"), minutes=("s", lambda s: s.sum() / 60),
                                     peak_rss_mb=("max_rss", "max"))
    return costs.sort_values("minutes", ascending=False)


def render_costs(costs: pd.DataFrame) -> str:
    total = costs["minutes"].sum()
    table = costs.reset_index().to_markdown(index=False, floatfmt=".1f")
    return f"{table}\n\n{int(costs['jobs'].sum())} jobs, {total:.1f} minutes of job time in all."
