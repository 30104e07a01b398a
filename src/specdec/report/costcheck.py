"""Every PyTorch row's speedup checked against its own costs.

In a plain step's time b (the baseline arm's decode ms per token, measured in the row's job), a
method's decode step costs
  D = draft ms per step / b        what drafting costs
  V = verification forward / b     what verifying its drafts costs
and emits t = the baseline's decode tokens / the method's decode steps (about tau) tokens, so
  decode speedup = t / (D + V).
The row measures D, t and the speedup itself. V is what the check is about: the row's step costs
say what a step of n nodes costs in plain steps, r(n). They are its job's own (`step_costs`: the
cost curve's cells timed between the job's arms, backends/torch_bench.py), so r(n) and the row
were measured under the same conditions; a row without them reads the host's cost curve
(backends/cost_curve.py), timed in its own job, where a shared machine may have run faster or
slower, and not alike for one-token and many-token steps. A row's steps draft m tokens on average
on a share f of its steps, so
  V_curve = (1 - f) * 1 + f * r(m + 1)      (r of a chain or a tree, as the row drafts)
  predicted = t / (D + V_curve).
The measured speedup is t / (D + V_row), with V_row its own target ms per step / b; a gap between
the two is a gap between V_row and V_curve: the verification steps measured cheaper (or dearer)
than the host's costs allow, relative to the baseline's steps. That happens when one arm ran under
load, or when the yardstick favours multi-token forwards. A gap above TOLERANCE flags the row.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from ..data.records import read_json

TOLERANCE = 0.10   # predicted and measured decode speedups agree within 10%, or the row is flagged


def read_curve(path) -> tuple[dict, pd.DataFrame]:
    """The cost curve's JSON (backends/cost_curve.py), checked, and its points as a frame: dtype,
    dataset, context, shape, nodes, ms, plain_steps."""
    curve = read_json(path)
    for key in ("points", "floors", "memory_read_gb_s"):
        if key not in curve:
            raise ValueError(f"{path}: cost curve has no field {key!r}")
    frame = pd.DataFrame(curve["points"])
    missing = {"dtype", "dataset", "shape", "nodes", "plain_steps"} - set(frame.columns)
    if missing:
        raise ValueError(f"{path}: cost curve points lack field(s) {sorted(missing)}")
    return curve, frame


def plain_steps(curve: pd.DataFrame, dtype: str, dataset: str, shape: str, nodes: float) -> float | None:
    """r(nodes): a verification step of `nodes` nodes in plain steps, interpolated linearly between
    the timed sizes (past the largest, along its last segment); None where the curve has no
    (dtype, dataset). A tree too small to branch is a chain: below its smallest timed size a tree
    reads the chain's points."""
    cell = curve[(curve["dtype"] == dtype) & (curve["dataset"] == dataset)]
    chain, pts = cell[cell["shape"] == "chain"], cell[cell["shape"] == shape]
    if shape != "chain":
        pts = pd.concat([chain[chain["nodes"] < pts["nodes"].min()] if len(pts) else chain, pts])
    if pts.empty:
        return None
    pts = pts.sort_values("nodes")
    x, y = pts["nodes"].to_numpy(float), pts["plain_steps"].to_numpy(float)
    if nodes > x[-1] and len(x) > 1:
        return float(y[-1] + (nodes - x[-1]) * (y[-1] - y[-2]) / (x[-1] - x[-2]))
    return float(np.interp(nodes, x, y))


def draft_kind(row) -> str:
    shape = row.get("draft_shape")
    return "tree" if isinstance(shape, str) and shape.startswith("tree") else "chain"


def job_curve(row) -> pd.DataFrame | None:
    """The row's own step costs (its job's, module doc) as curve points, or None where it has none."""
    costs = row.get("step_costs")
    if isinstance(costs, str):    # the rows frame stores lists as JSON text (report/rows.py)
        costs = json.loads(costs)
    if not isinstance(costs, list) or not costs:
        return None
    return pd.DataFrame(costs).assign(dtype=row["dtype"], dataset=row["dataset"])


def predict(row, curve: pd.DataFrame | None) -> dict | None:
    """The row's cost account (module doc), or None where it cannot have one: not our loop, no
    per-step costs (a peer), or no step costs for its dtype and set (its job's, else `curve`'s)."""
    need = ("decode_speedup", "decode_s", "draft_ms_per_step", "target_ms_per_step", "steps", "drafting_steps",
            "drafted_tokens", "baseline_wall_s", "baseline_throughput_tok_s", "prompts")
    if row.get("backend") != "torch" or any(pd.isna(row.get(k)) for k in need):
        return None
    step_ms = row["draft_ms_per_step"] + row["target_ms_per_step"]
    decode_steps = 1000 * row["decode_s"] / step_ms
    base_tokens = row["baseline_throughput_tok_s"] * row["baseline_wall_s"]   # the baseline arm's new tokens
    base_decode_s = row["decode_speedup"] * row["decode_s"]
    base_decode_tokens = base_tokens - row["prompts"]    # its first token of each prompt comes from the prefill
    b = 1000 * base_decode_s / base_decode_tokens         # ms per plain step
    f = row["drafting_steps"] / row["steps"] if row["steps"] else 0.0
    m = row["drafted_tokens"] / row["drafting_steps"] if row["drafting_steps"] else 0.0
    own = job_curve(row)
    reference = "job" if own is not None else "host curve"
    if own is None and curve is None:
        return None
    ref = own if own is not None else curve
    r = plain_steps(ref, row["dtype"], row["dataset"], draft_kind(row), m + 1) if f else 1.0
    if r is None:
        return None
    tokens = base_decode_tokens / decode_steps
    draft, verify_curve = row["draft_ms_per_step"] / b, (1 - f) + f * r
    predicted = tokens / (draft + verify_curve)
    return {"tokens_per_step": tokens, "draft_cost": draft, "verify_cost": verify_curve,
            "verify_cost_measured": row["target_ms_per_step"] / b, "baseline_ms_per_token": b,
            "predicted_decode_speedup": predicted, "cost_gap": row["decode_speedup"] / predicted - 1,
            "verify_reference": reference}


def explain(row, account: dict) -> str:
    """One line: what drafting costs, what verification costs, what tau buys."""
    return (f"{account['tokens_per_step']:.2f} tokens per step for {account['draft_cost']:.2f} plain steps of "
            f"drafting and {account['verify_cost']:.2f} of verification: "
            f"{account['tokens_per_step']:.2f} / {account['draft_cost'] + account['verify_cost']:.2f} = "
            f"{account['predicted_decode_speedup']:.2f}x predicted, {row['decode_speedup']:.2f}x measured")


def flag(row, account: dict) -> str | None:
    """Why the row's measured speedup is not what its costs predict (None: within TOLERANCE)."""
    gap = account["cost_gap"]
    if abs(gap) <= TOLERANCE:
        return None
    where = "above" if gap > 0 else "below"
    cause = ("faster than its costs allow: the baseline arm ran slower than the plain steps timed beside it, or the "
             "yardstick favours multi-token forwards; not a result" if gap > 0 else
             "slower than its costs predict: load during this arm, or costs outside the drafter and the "
             "verification forward")
    return (f"decode speedup {row['decode_speedup']:.2f}x, {100 * abs(gap):.0f}% {where} the "
            f"{account['predicted_decode_speedup']:.2f}x its costs predict; its verification steps measured "
            f"{account['verify_cost_measured']:.2f} plain steps where "
            f"{'its job' if account['verify_reference'] == 'job' else 'the cost curve'} gives "
            f"{account['verify_cost']:.2f}: {cause}")


def check_costs(frame: pd.DataFrame, curve: pd.DataFrame | None) -> pd.DataFrame:
    """The frame with each PyTorch row's cost account (predict) and its flag (`_cost`: why, or None)."""
    keys = ("tokens_per_step", "draft_cost", "verify_cost", "verify_cost_measured", "predicted_decode_speedup",
            "cost_gap", "verify_reference", "_cost", "cost_account")
    cols = {k: [] for k in keys}
    for _, r in frame.iterrows():
        a = predict(r, curve)
        a = {**a, "_cost": flag(r, a), "cost_account": explain(r, a)} if a else {}
        for k in keys:
            cols[k].append(a.get(k))
    return frame.assign(**cols)
