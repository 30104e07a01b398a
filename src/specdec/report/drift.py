"""The reproducibility check: the same benchmark rows from two runs at the same code (results/
and results/rerun/), and how far each speedup moved between them."""
from __future__ import annotations

import pandas as pd

from .rows import KEY, rows_frame

START, END = "<!-- drift:start -->", "<!-- drift:end -->"


def drift_frame(first_paths, second_paths) -> pd.DataFrame:
    cols = KEY + ["label", "speedup", "ci_low", "ci_high", "tau", "matches_baseline"]
    a, b = (rows_frame(p) for p in (first_paths, second_paths))
    a, b = (f[f["speedup"].notna()][[c for c in cols if c in f]] for f in (a, b))
    both = a.merge(b, on=KEY + ["label"], suffixes=("_1", "_2"), validate="one_to_one")
    both["drift"] = both["speedup_2"] / both["speedup_1"] - 1
    return both.sort_values(KEY).reset_index(drop=True)


def render_drift(both: pd.DataFrame) -> str:
    chat = both[both["dataset"].str.startswith("chat") & both["dtype_requested"].eq("auto")]
    worst = chat["drift"].abs().max() if len(chat) else float("nan")
    view = pd.DataFrame({
        "Backend": [f"{r['backend']} {r['mode']}" for _, r in both.iterrows()],
        "Data set": both["dataset"],
        "Dtype": [r["dtype"] + (" (auto)" if r["dtype_requested"] == "auto" else "") for _, r in both.iterrows()],
        "Method": both["label"],
        **{f"Run {i} speedup [95% CI]": [f"{r[f'speedup_{i}']:.2f}x [{r[f'ci_low_{i}']:.2f}, {r[f'ci_high_{i}']:.2f}]"
                                          for _, r in both.iterrows()] for i in (1, 2)},
        "Drift": [f"{100 * d:+.1f}%" for d in both["drift"]],
        "Tau 1 / 2": [f"{r['tau_1']:.2f} / {r['tau_2']:.2f}" if pd.notna(r["tau_1"]) and pd.notna(r["tau_2"]) else "-"
                      for _, r in both.iterrows()],
    })
    return "\n".join([
        "### Reproducibility: two runs of the benchmark stage at the same code", "",
        f"{len(both)} rows in both runs; largest speedup drift on a chat row in the speed dtype: "
        f"**{100 * worst:.1f}%**. Drift = run 2 / run 1 - 1.", "", view.to_markdown(index=False), ""])


def write_drift(first_paths, second_paths, out: str) -> pd.DataFrame:
    """results/drift.md (`specdec publish` copies it into docs/reproducibility.md)."""
    from ..data.records import write_text

    both = drift_frame(first_paths, second_paths)
    text = render_drift(both)
    write_text(out, text)
    print(text)
    return both
