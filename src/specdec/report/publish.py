"""The one step that writes outside the DAG's declared outputs, run by hand after the DAG:
`specdec publish` copies the report's results section (results/readme_section.md), the job-cost
table (Snakemake's `benchmark:` files, summed per rule) and, where the drift check ran, its table
(results/drift.md) into README.md and docs/reproducibility.md, each between its markers. No job
writes these pages (a job writes only its declared outputs, and README.md cannot be one: Snakemake
removes a job's outputs before it runs)."""
from __future__ import annotations

from pathlib import Path

from ..data.records import write_text
from . import costs, drift, tables


def patch(page: str, text: str, start: str, end: str) -> None:
    """Replace what lies between the markers `start` and `end` of `page` with `text`."""
    body = Path(page).read_text()
    if start not in body or end not in body:
        raise ValueError(f"{page}: no markers {start} ... {end} to write between")
    head, rest = body.split(start, 1)
    _, tail = rest.split(end, 1)
    write_text(page, f"{head}{start}\n\n{text.strip()}\n\n{end}{tail}")


def publish(readme: str = "README.md", section: str = "results/readme_section.md",
            benchmarks: str = "benchmarks", drift_table: str = "results/drift.md",
            reproducibility: str = "docs/reproducibility.md") -> list[str]:
    """Patch the pages from the DAG's outputs; returns a line per part, what was written or why not.
    The results section is required (run the DAG first); the job costs need the run's benchmark
    files, the drift table the drift check's output."""
    if not Path(section).is_file():
        raise FileNotFoundError(f"{section}: no results section; run `snakemake results/tables.md` first")
    patch(readme, Path(section).read_text(), tables.START, tables.END)
    done = [f"{readme}: results section from {section}"]
    if list(Path(benchmarks).rglob("*.tsv")):
        patch(readme, costs.render_costs(costs.job_costs(benchmarks)), costs.START, costs.END)
        done.append(f"{readme}: job costs from {benchmarks}/")
    else:
        done.append(f"{readme}: job costs NOT written: no benchmark files under {benchmarks}/")
    if Path(drift_table).is_file():
        patch(reproducibility, Path(drift_table).read_text(), drift.START, drift.END)
        done.append(f"{reproducibility}: drift table from {drift_table}")
    else:
        done.append(f"{reproducibility}: drift table NOT written: no {drift_table} "
                    "(run `snakemake results/drift.md` for it)")
    return done
