"""PNG plots from the results frame (report.rows): paired speedup with its 95% interval,
throughput, acceptance by draft position."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import pandas as pd

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .tables import dataset_order, dtype_name, lossless_check


def _label(r) -> str:
    where = f"vLLM {r['mode']}" if r["backend"] == "vllm" else "torch"
    return f"{r['label']} ({where}, {dtype_name(r)})"


def _datasets(frame: pd.DataFrame) -> list[str]:
    return dataset_order(frame) if len(frame) else []


def _title(frame: pd.DataFrame, ds: str) -> str:
    t = frame.loc[frame["dataset"] == ds, "temperature"].max() if "temperature" in frame else 0
    return f"{ds} (sampled, T = {t:g})" if t > 0 else ds


def _bars(frame: pd.DataFrame, key: str, title: str, ylabel: str, path: Path, errors: bool = False,
          line: float | None = None) -> Path:
    frame = frame[frame[key].notna()] if key in frame else frame.iloc[:0]
    datasets = _datasets(frame) or ["none"]
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.5 * len(datasets), 4.6), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        rows = frame[frame["dataset"] == ds]
        rows = rows.assign(_l=[_label(r) for _, r in rows.iterrows()]).sort_values("_l")
        x = range(len(rows))
        yerr = None
        if errors and len(rows):
            value, low, high = (rows[c].astype(float) for c in (key, "ci_low", "ci_high"))
            yerr = [(value - low).fillna(0).clip(lower=0).to_numpy(), (high - value).fillna(0).clip(lower=0).to_numpy()]
        # the speed dtype (auto) against a dtype the config names (the fp32 lossless checks): on
        # a host whose speed dtype is float32 both are fp32, and only the request tells them apart
        colors = ["tab:blue" if d == "auto" else "tab:orange" for d in rows["dtype_requested"]]
        ax.bar(x, rows[key].astype(float), yerr=yerr, capsize=3, color=colors)
        ax.set_xticks(list(x), list(rows["_l"]), rotation=60, ha="right", fontsize=7)
        if line is not None:
            ax.axhline(line, color="grey", lw=1, ls="--")
        ax.set_title(_title(frame, ds))
        ax.set_ylabel(ylabel)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(frame: pd.DataFrame, out_dir: str) -> list[str]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ok = frame[frame["error"].isna()] if "error" in frame else frame
    ok = ok[~lossless_check(ok)]   # vLLM's float32 output check: its match counts are in the tables
    paths = [
        _bars(ok, "speedup", "Paired speedup over the greedy baseline, with 95% intervals (blue: the "
              "speed dtype, orange: a dtype set in the config, the fp32 lossless checks)", "speedup (x)",
              out / "speedup.png", errors=True, line=1.0),
        _bars(ok, "throughput_tok_s", "Throughput", "tokens / s", out / "throughput.png"),
    ]
    datasets = _datasets(ok) or ["none"]
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.5 * len(datasets), 4), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        for _, r in ok[ok["dataset"] == ds].iterrows():
            pos = json.loads(r["acceptance_by_position"]) if isinstance(r.get("acceptance_by_position"), str) else []
            if pos:
                ax.plot(range(1, len(pos) + 1), pos, marker="o", label=_label(r))
        ax.set_title(_title(ok, ds))
        ax.set_xlabel("draft position")
        ax.set_ylabel("share of steps accepted through it")
        ax.set_ylim(0, 1)
        if ax.lines:
            ax.legend(fontsize=6)
    fig.suptitle("Acceptance by draft position")
    fig.tight_layout()
    fig.savefig(out / "acceptance_by_position.png", dpi=110)
    plt.close(fig)
    paths.append(out / "acceptance_by_position.png")
    return [str(p) for p in paths]


def plot_learning_curve(curve: pd.DataFrame, out_path: str) -> str:
    """Held-out (and train-overlap) first-step accuracy against training records (log x)."""
    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.plot(curve["records"], curve["heldout_step1"], marker="o", label="held-out")
    ax.plot(curve["records"], curve["overlap_step1"], marker="s", ls="--", color="grey",
            label="train-overlap (best case)")
    ax.set_xscale("log")
    ax.set_xticks(list(curve["records"]), [str(n) for n in curve["records"]])
    ax.minorticks_off()
    ax.set_xlabel("training records")
    ax.set_ylabel("first draft step top-1 accuracy")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    method, steps = curve["method"].iloc[-1], int(curve["steps"].iloc[-1])
    ax.set_title(f"{method}: {steps} training steps at every size", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def plot_cost_curve(curve: pd.DataFrame, out_path: str) -> str:
    """A verification step of n nodes in plain steps, one panel per dtype, a line per (set, shape)."""
    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dtypes = list(dict.fromkeys(curve["dtype"]))
    fig, axes = plt.subplots(1, len(dtypes), figsize=(5 * len(dtypes), 4), squeeze=False, sharey=True)
    for ax, dtype in zip(axes[0], dtypes):
        for (ds, shape), cell in curve[curve["dtype"] == dtype].groupby(["dataset", "shape"], sort=False):
            cell = cell.sort_values("nodes")
            label = f"{ds}, {shape} (context {int(cell['context'].iloc[0])})"
            ax.plot(cell["nodes"], cell["plain_steps"], marker="o" if shape == "chain" else "s",
                    ls="-" if shape == "chain" else "--", label=label)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("nodes per verification step (pending token + drafts)")
        ax.set_title(dtype, fontsize=10)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("cost in plain decoding steps")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
