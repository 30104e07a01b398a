"""The report's outputs: the tables, the plots, the tidy rows and the README's section, from the
benchmark summaries (tables renders, plots draws; this module writes both)."""

from __future__ import annotations

import os
from pathlib import Path

from ..data.records import atomic_path, write_text
from .costcheck import check_costs, read_curve
from .plots import plot_all, plot_cost_curve, plot_learning_curve
from .rows import rows_frame, write_rows
from .tables import (
    CSV_COLUMNS,
    learning_curve_frame,
    render_checkpoints,
    render_cost_curve,
    render_learning_curve,
    render_readme_section,
    render_tables,
    rows_html,
)


def write_report(summary_paths, out_tables: str, plots_dir: str, readme_section: str,
                 checkpoint_configs=(), out_rows: str | None = None, out_csv: str | None = None,
                 out_html: str | None = None, sizing: str | None = None, cost_curve: str | None = None,
                 out_cost_table: str | None = None) -> None:
    """The tables, the plots, the tidy rows and the README's results section (its links relative
    to the working directory, where README.md is; `specdec publish` copies it into the README).
    `sizing`: the DAG's size for the host class that planned it, a line under the host's.
    Every PyTorch row's speedup is checked against its job's own step costs (report.costcheck);
    `cost_curve`: the host's cost curve, the reference of a row without them; `out_cost_table`
    renders it, with its plot in plots_dir."""
    frame = rows_frame(summary_paths)
    curve, points = read_curve(cost_curve) if cost_curve else (None, None)
    frame = check_costs(frame, points)
    if cost_curve and out_cost_table:
        plot = plot_cost_curve(points, os.path.join(plots_dir, "cost_curve.png"))
        rel = os.path.relpath(plot, os.path.dirname(os.path.abspath(out_cost_table)))
        write_text(out_cost_table, render_cost_curve(curve, points, frame) + f"\n![cost curve]({rel})\n")
    if out_rows:
        write_rows(frame, out_rows)
    if out_csv:   # the rows a reader compares, for the Snakemake report
        with atomic_path(out_csv) as tmp:
            frame.reindex(columns=CSV_COLUMNS).to_csv(tmp, index=False, float_format="%.4g")
    if out_html:
        write_text(out_html, rows_html(frame))
    tables = render_tables(frame, sizing)
    ckpts = render_checkpoints(list(checkpoint_configs))
    if ckpts:
        tables = tables + "\n" + ckpts
    plots = plot_all(frame, plots_dir)
    speedup_plot = next((p for p in plots if Path(p).stem == "speedup"), None)
    section = render_readme_section(frame, os.path.relpath(out_tables),
                                    None if speedup_plot is None else os.path.relpath(speedup_plot), sizing)
    write_text(out_tables, tables + "\n")
    write_text(readme_section, section + "\n")


def write_learning_curve(ckpt_dirs, out_table: str, out_plot: str) -> None:
    """results/learning_curve.md and its plot, from one proposer's checkpoints at growing sizes."""
    curve = learning_curve_frame(list(ckpt_dirs))
    first, last = curve.iloc[0], curve.iloc[-1]
    summary = (f"{last['method']} trained with the same settings and {int(last['steps'])} steps on the first N "
               f"training records: its held-out first-step accuracy went from {100 * first['heldout_step1']:.1f}% "
               f"with {int(first['records'])} records to {100 * last['heldout_step1']:.1f}% with "
               f"{int(last['records'])}.")
    plot = plot_learning_curve(curve, out_plot)
    rel = os.path.relpath(plot, os.path.dirname(os.path.abspath(out_table)))
    write_text(out_table, render_learning_curve(curve) + f"\n{summary}\n\n![learning curve]({rel})\n")
