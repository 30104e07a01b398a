"""Paired speedups and their 95% intervals.

A speedup compares two arms timed in one process, alternately, on the same units:
- units = prompts (our loop; vLLM serial): speedup = sum(baseline walls) / sum(method walls),
  the aggregate over the prompts, and its interval is a paired percentile bootstrap: resample
  prompts with replacement (each prompt keeps both its walls) and recompute the ratio of sums;
- units = rounds (vLLM batched, each round the whole batch): too few for a bootstrap, so the
  speedup is the geometric mean of per-round ratios and the interval a t-interval on their logs.
Neither interval covers the drift of a whole machine between runs; the drift check does.
A job times several arms against one baseline arm; unit i (a prompt, or a round) runs them in the
order `rotated(arms, i)`, so each arm takes each place in the order equally often over the units.
"""
from __future__ import annotations

import math

import numpy as np

LEVEL = 0.95


BASELINE = "baseline"   # the arm every method of a job is timed against
# the A/A control: a second baseline arm, timed as a method; its row must read 1.0x
AA_CONTROL = {"method": BASELINE, "variant": "aa"}


def arm_label(arm: dict) -> str:
    """An arm's method/variant: the summary's and the records' method field."""
    return arm["method"] if arm.get("variant") is None else f"{arm['method']}/{arm['variant']}"


def rotated(names: list[str], i: int) -> list[str]:
    """The arm order for unit i: the list rotated left by i."""
    k = i % len(names)
    return names[k:] + names[:k]


def paired_bootstrap(base: list[float], method: list[float], resamples: int = 10000,
                     seed: int = 0) -> dict:
    """Speedup sum(base) / sum(method) over paired units, with a percentile bootstrap interval."""
    b, m = np.asarray(base, dtype=float), np.asarray(method, dtype=float)
    if b.shape != m.shape or b.ndim != 1 or len(b) == 0:
        raise ValueError(f"paired walls must be two equal, non-empty lists; got {b.shape} and {m.shape}")
    idx = np.random.default_rng(seed).integers(0, len(b), size=(resamples, len(b)))  # (R, n) prompt draws
    ratios = b[idx].sum(axis=1) / m[idx].sum(axis=1)                                  # (R,)
    lo, hi = np.quantile(ratios, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return {"speedup": float(b.sum() / m.sum()), "ci": [float(lo), float(hi)],
            "ci_method": f"paired percentile bootstrap over {len(b)} prompts, {resamples} resamples, seed {seed}",
            "units": len(b)}


def rounds_t_interval(base: list[float], method: list[float]) -> dict:
    """Geometric-mean speedup over paired rounds, with a t-interval on the per-round log ratios."""
    from scipy import stats

    if len(base) != len(method) or len(base) < 2:
        raise ValueError(f"need at least two paired rounds, got {len(base)} and {len(method)}")
    logs = np.log(np.asarray(base, dtype=float) / np.asarray(method, dtype=float))
    mean, n = float(logs.mean()), len(logs)
    half = float(stats.t.ppf((1 + LEVEL) / 2, n - 1) * logs.std(ddof=1) / math.sqrt(n))
    return {"speedup": math.exp(mean), "ci": [math.exp(mean - half), math.exp(mean + half)],
            "ci_method": f"t-interval on the log ratios of {n} alternating rounds (ABBA)", "units": n}


def half_width(ci: list[float], speedup: float) -> float:
    """The interval's half-width relative to the speedup (0.1: +-10%)."""
    return (ci[1] - ci[0]) / (2 * speedup)
