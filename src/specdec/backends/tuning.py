"""Tuned variants: each benchmarked variant's draft length or tree size chosen for this host, on a
tuning split that the benchmarks never read, from the same cost account that checks every row.

A method that declares a tuning_grid (methods/__init__.py) names one parameter and the values it
may take. For every such arm of a PyTorch benchmark job, the tuning job decodes the split with
each candidate (the variant's own parameters, then each grid value) and one baseline arm, all in
one process, prompt by prompt in a balanced order (backends/torch_bench.py). Each candidate's
decode speedup is predicted from its costs (report/costcheck.py):
  predicted = t / (D + V)
with t its tokens per step and D its drafting time in plain steps, both measured on the split, and
V what a verification step of its average draft size costs by the step costs timed in the tuning
job itself, between its arms (backends/torch_bench.py; the host's cost curve for a row without them). The tuned
variant takes the candidate with the highest prediction, where that beats the fixed variant's
by more than MARGIN (else the fixed variant is its own tuned one). The speedups measured on the split are
recorded beside them, but a few prompts time too noisily to choose by, and the prediction's t and
D are averages over every step.

The benchmark job then times the tuned variant beside its fixed one on the held-out prompts
(`<variant>.tuned`), unless the choice is the fixed variant itself: then its row says so, and no
arm is timed twice.
"""
from __future__ import annotations

import pandas as pd

from .. import methods
from ..core.stats import arm_label
from ..data.records import read_json, write_json
from ..report.costcheck import check_costs, read_curve
from ..report.rows import rows_frame
from .torch_bench import bench_torch

TUNED = "tuned"   # the tuned variant's name: <fixed variant>.tuned
# a candidate replaces the fixed variant only where its predicted decode speedup is this much higher:
# closer than that, the prediction's own noise (drafting time over a few prompts) would choose
MARGIN = 0.02


def candidate_name(variant: str, fixed: dict, params: dict) -> str:
    """The candidate's variant name: the fixed variant's, or it with the parameter it changes
    (len3.draft_len5)."""
    changed = [f"{k}{v}" for k, v in params.items() if fixed.get(k) != v]
    return ".".join([variant, *changed])


def candidate_arms(arms: list[dict]) -> list[dict]:
    """{"fixed": arm label, "candidates": [arm, ...]} for every arm whose method has a tuning grid
    (the fixed variant is its first candidate); peers, controls and methods without a grid are
    not tuned."""
    out = []
    for arm in arms:
        if arm["method"] not in methods.names() or arm.get("compare_with"):
            continue
        params = arm.get("params") or {}
        grid = methods.tuning_candidates(arm["method"], params)
        if len(grid) < 2:
            continue
        out.append({"fixed": arm_label(arm), "candidates": [
            {"method": arm["method"], "variant": candidate_name(arm["variant"], params, p), "params": p}
            for p in grid]})
    return out


def pick(candidates: list[dict]) -> dict:
    """The candidate of highest predicted decode speedup, unless it beats the first (the fixed
    variant) by MARGIN or less: then the fixed variant."""
    fixed, best = candidates[0], max(candidates, key=lambda c: c["predicted_decode_speedup"])
    return best if best["predicted_decode_speedup"] > (1 + MARGIN) * fixed["predicted_decode_speedup"] else fixed


def choose(summary_path: str, groups: list[dict], curve_path: str) -> list[dict]:
    """Each group's candidates with their cost account on the tuning split, and its choice (pick).
    Raises where a candidate has no prediction (no step costs of its job, and its dtype or data set
    is not in the cost curve)."""
    _, curve = read_curve(curve_path)
    frame = check_costs(rows_frame([summary_path]), curve).set_index("label")
    out = []
    for g in groups:
        rows = []
        for arm in g["candidates"]:
            r = frame.loc[arm_label(arm)]
            if pd.isna(r["predicted_decode_speedup"]):
                raise ValueError(f"{curve_path}: no cost curve for {r['dtype']} on {r['dataset']}: "
                                 f"cannot predict {arm_label(arm)}")
            rows.append({**arm, "tau": float(r["tau"]), "tokens_per_step": float(r["tokens_per_step"]),
                         "draft_cost": float(r["draft_cost"]), "verify_cost": float(r["verify_cost"]),
                         "predicted_decode_speedup": float(r["predicted_decode_speedup"]),
                         "measured_decode_speedup": float(r["decode_speedup"]),
                         "measured_speedup": float(r["speedup"])})
        fixed, best = rows[0], pick(rows)
        out.append({"fixed": g["fixed"], "method": fixed["method"],
                    "variant": f"{g['fixed'].partition('/')[2]}.{TUNED}", "params": best["params"],
                    "chosen": best["variant"], "same_as_fixed": best is fixed,
                    "predicted_decode_speedup": best["predicted_decode_speedup"],
                    "fixed_predicted_decode_speedup": fixed["predicted_decode_speedup"], "candidates": rows})
    return out


def tune_torch(*, arms: list[dict], cost_curve: str, out: str, out_records: str, out_summary: str,
               skip: int, **bench) -> dict:
    """Decode the tuning split (the prompts file's records after the first `skip`) with every
    candidate of every tunable arm, choose each arm's tuned parameters, and write
    {"dataset", "dtype", "prompts": {...}, "choices": [...]} to `out`. `bench`: bench_torch's
    settings (target_dir, prompts_path, dataset, limit, max_new_tokens, dtype, ...)."""
    groups = candidate_arms(arms)
    if not groups:
        raise ValueError(f"{bench['dataset']}: no arm to tune: no method of {[arm_label(a) for a in arms]} "
                         "declares a tuning_grid")
    summary = bench_torch(arms=[c for g in groups for c in g["candidates"]], out_records=out_records,
                          out_summary=out_summary, skip=skip, **bench)
    result = {"dataset": bench["dataset"], "dtype": summary["dtype"],
              "prompts": {"file": str(bench["prompts_path"]), "skip": skip, "limit": bench.get("limit"),
                          "max_new_tokens": bench.get("max_new_tokens")},
              "cost_curve": str(cost_curve), "choices": choose(out_summary, groups, cost_curve)}
    write_json(out, result)
    return result


def tuned_arms(path: str, arms: list[dict]) -> tuple[list[dict], dict]:
    """(the tuned arms to time beside `arms`, label -> the choice of every tuned arm, its fixed
    arm's label too) from a tuning job's file: a tuned arm for each choice that differs from its
    fixed variant. Raises where a choice's fixed arm is not among `arms` or its parameters
    changed since the tuning (the tuning is stale)."""
    tuning = read_json(path)
    by_label = {arm_label(a): a for a in arms}
    extra, choices = [], {}
    for c in tuning["choices"]:
        fixed = by_label.get(c["fixed"])
        if fixed is None:
            raise ValueError(f"{path}: tuned {c['fixed']} is not an arm of this job ({', '.join(by_label)})")
        if (fixed.get("params") or {}) != c["candidates"][0]["params"]:
            raise ValueError(f"{path}: {c['fixed']}'s parameters changed since it was tuned; rerun the tuning")
        choice = {k: v for k, v in c.items() if k != "candidates"}
        choices[c["fixed"]] = choice
        if not c["same_as_fixed"]:
            arm = {"method": c["method"], "variant": c["variant"], "params": c["params"]}
            extra.append(arm)
            choices[arm_label(arm)] = choice
    return extra, choices
