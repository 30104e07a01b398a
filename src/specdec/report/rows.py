"""The tidy results table: one row per benchmark row summary, every summary field a column. A
PyTorch job's summary file holds every method row of its (dtype, data set); a vLLM job's every row
of its method variant.

Key: (backend, mode, dataset, dtype, method, variant, proposer); proposer: whose implementation
drafted ("specdec": ours, in our loop or inside vLLM; "vllm": vLLM's). Nested summary fields are flattened with
pandas (`settings.params.draft_len`, `environment.cpu.isa`); lists and mappings that do not fit a
column are stored as JSON text. `results/rows.parquet` is written from this frame, and the tables,
the README section and the plots are rendered from it.
"""
from __future__ import annotations

import json

import pandas as pd

from .. import methods
from ..data.records import atomic_path, read_json

# dtype_requested too: on a host whose speed dtype is float32 but planned as a bf16-native one (as
# the smoke config is), a job of `auto` (the speed rows) and one of `float32` (the lossless checks)
# time the same methods in the same dtype
KEY = ["backend", "mode", "dataset", "dtype", "dtype_requested", "method", "variant", "proposer"]
# a headline row: our loop, the speed dtype, prompts no drafter trained on
HEADLINE = {"backend": "torch", "dataset": "chat_heldout", "dtype_requested": "auto"}


def load_summaries(path) -> list[dict]:
    """A job's summary file, {"rows": [...]} (a PyTorch job: every method of one dtype and data
    set; a vLLM job: every row of one method variant), or a single row's summary; each row checked."""
    s = read_json(path)
    rows = s["rows"] if isinstance(s.get("rows"), list) else [s]
    if not rows:
        raise ValueError(f"{path}: summary has no rows")
    for i, row in enumerate(rows):
        where = f"rows[{i}]." if "rows" in s else ""
        required = ("method", "dataset", "settings") + (() if "error" in row else ("wall_s", "throughput_tok_s"))
        for key in required:
            if key not in row:
                raise ValueError(f"{path}: summary has no field {where}{key!r}")
        for key in ("backend", "dtype"):
            if key not in row["settings"]:
                raise ValueError(f"{path}: summary has no field {where}settings.{key!r}")
    return rows


def _cell(x):
    return json.dumps(x) if isinstance(x, (list, dict)) else x


def rows_frame(paths) -> pd.DataFrame:
    loaded = [(str(p), s) for p in paths for s in load_summaries(p)]
    summaries = [s for _, s in loaded]
    frame = pd.json_normalize(summaries, max_level=2)
    frame = frame.apply(lambda col: col.map(_cell) if col.dtype == object else col)
    def st(key):
        return frame.get(f"settings.{key}", pd.Series(None, index=frame.index, dtype=object)).astype(object)

    frame.insert(0, "backend", st("backend"))
    frame.insert(1, "mode", st("mode").where(st("mode").notna(), "loop"))
    frame["method"], frame["variant"] = st("method"), st("variant")
    frame["proposer"] = st("proposer").where(st("proposer").notna(),
                                             frame["backend"].map({"vllm": "vllm"}).fillna("specdec"))
    frame["label"] = [s["method"] for s in summaries]   # method/variant, as in the records
    frame["dtype"] = st("dtype")
    # "lossless": a vLLM job that checks outputs in float32 (vllm.lossless), not a timing
    frame["role"] = st("role").where(st("role").notna(), "timing")
    frame["dtype_requested"] = st("dtype_requested").where(st("dtype_requested").notna(), frame["dtype"])
    # 0: greedy; a sampled row's temperature (settings.sampling)
    frame["temperature"] = [float((s["settings"].get("sampling") or {}).get("temperature", 0.0)) for s in summaries]
    ci = [s.get("speedup_ci") or [None, None] for s in summaries]
    frame["ci_low"] = [c[0] for c in ci]
    frame["ci_high"] = [c[1] for c in ci]
    frame["summary_path"] = [p for p, _ in loaded]
    frame["headline"] = (frame["backend"].eq(HEADLINE["backend"]) & frame["dataset"].eq(HEADLINE["dataset"])
                         & frame["dtype_requested"].eq(HEADLINE["dtype_requested"])
                         & ~frame["method"].isin(list(methods.PEERS)))
    duplicated = frame.duplicated(KEY, keep=False)
    if duplicated.any():
        raise ValueError(f"two summaries for one row: {sorted(frame.loc[duplicated, 'summary_path'])}")
    return frame.sort_values(KEY).reset_index(drop=True)


def write_rows(frame: pd.DataFrame, path: str) -> None:
    """Write the frame as parquet (atomically)."""
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)
