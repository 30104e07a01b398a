"""Paired speedups and their 95% intervals.

A speedup compares two arms timed in one process, alternately, on the same units:
- units = prompts (our loop; vLLM serial): speedup = sum(baseline walls) / sum(method walls),
  the aggregate over the prompts, and its interval is a paired percentile bootstrap: resample
  prompts with replacement (each prompt keeps both its walls) and recompute the ratio of sums;
- units = rounds (vLLM batched, each round the whole batch): too few for a bootstrap, so the
  speedup is the geometric mean of per-round ratios and the interval a t-interval on their logs.
Neither interval covers the drift of a whole machine between runs; the drift check does.
A job times several arms against one baseline arm; unit i (a prompt, or a round) runs them in the
order `balanced(arms, i)`: over a cycle of units each arm takes each place in the order equally
often, and runs right after each other arm equally often (a Williams design), so no arm always runs
first, on a colder machine, or always after the same neighbour.
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
    """The list rotated left by i."""
    k = i % len(names)
    return names[k:] + names[:k]


def balanced(names: list[str], i: int) -> list[str]:
    """The arm order for unit i, from a Williams design: row k of n arms runs arm (s_j + k) mod n
    at place j, s = 0, 1, n-1, 2, n-2, ...; each arm takes each place once in n rows, and each
    ordered pair of arms is adjacent once. An odd n needs the n rows reversed as well (2n rows).
    A cycle is n (even) or 2n (odd) units; unit i takes row i mod the cycle."""
    n = len(names)
    if n < 3:
        return rotated(names, i)
    k = i % (n if n % 2 == 0 else 2 * n)
    s = [0] + [(j + 1) // 2 if j % 2 else n - j // 2 for j in range(1, n)]
    order = [names[(sj + k) % n] for sj in s]
    return order[::-1] if k >= n else order


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
