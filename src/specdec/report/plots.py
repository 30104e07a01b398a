"""PNG plots: speedup by method, acceptance by draft position, throughput."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _label(s: dict) -> str:
    st = s["settings"]
    where = f"vLLM {st['mode']}" if st["backend"] == "vllm" else "torch"
    return f"{s['method']} ({where}, {st['dtype']})"


def _bars(summaries, key, title, ylabel, path, baseline_line=None):
    datasets = sorted({s["dataset"] for s in summaries})
    fig, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 4.2), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        rows = [s for s in summaries if s["dataset"] == ds and s.get(key) is not None]
        rows.sort(key=lambda s: (_label(s).split("(")[1], s["method"]))
        ax.bar(range(len(rows)), [s[key] for s in rows], color="tab:blue")
        ax.set_xticks(range(len(rows)), [_label(s) for s in rows], rotation=60, ha="right", fontsize=8)
        if baseline_line is not None:
            ax.axhline(baseline_line, color="grey", lw=1, ls="--")
        ax.set_title(ds)
        ax.set_ylabel(ylabel)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(summaries: list[dict], out_dir: str) -> list[str]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [
        _bars([s for s in summaries if s["method"] != "baseline"], "speedup",
              "Speedup over the shared greedy baseline (wall time)", "speedup (x)",
              out / "speedup.png", baseline_line=1.0),
        _bars(summaries, "throughput_tok_s", "Throughput", "tokens / s", out / "throughput.png"),
    ]
    accept = [s for s in summaries if s.get("acceptance_by_position")]
    datasets = sorted({s["dataset"] for s in accept}) or ["none"]
    fig, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 4), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        for s in (x for x in accept if x["dataset"] == ds):
            pos = s["acceptance_by_position"]
            ax.plot(range(1, len(pos) + 1), pos, marker="o", label=_label(s))
        ax.set_title(ds)
        ax.set_xlabel("draft position")
        ax.set_ylabel("share of steps accepted through it")
        ax.set_ylim(0, 1)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.suptitle("Acceptance by draft position")
    fig.tight_layout()
    fig.savefig(out / "acceptance_by_position.png", dpi=110)
    plt.close(fig)
    paths.append(out / "acceptance_by_position.png")
    return [str(p) for p in paths]
