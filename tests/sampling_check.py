"""Is speculative sampling lossless in distribution? A chi-square goodness-of-fit test of the
first few sampled tokens against the target's exact joint distribution, enumerated.

Design (the figures the tests state):
- outcome: the joint of the first TOKENS generated tokens; top-k = TOP_K keeps the support at
  TOP_K ** TOKENS cells (27), each enumerable with a handful of target forwards;
- N = SAMPLES seeded decodes (seeds 0..N-1, so a run repeats exactly); cells whose expected
  count is below 5 are pooled; a sample outside the target's support fails outright;
- significance ALPHA = 0.001; with these N and 27 cells the test has power > 0.99 against any
  output distribution at Cohen's effect size w >= EFFECT (w^2 = sum (p1 - p0)^2 / p0), which
  `test_power_of_the_distribution_test` computes from the noncentral chi-square.
"""
from __future__ import annotations

import torch
from scipy import stats

from specdec.core.loop import decode
from specdec.core.sampling import Sampling, process
from specdec.core.target import TargetModel

TOKENS = 3
TOP_K = 3
# the tiny random targets' logits span a few tenths: at T = 0.05 their top-3 distributions are
# about as peaked as a real LM's at T = 0.7 (top token 0.4-0.8)
TEMPERATURE = 0.05
SAMPLES = 2000
ALPHA = 0.001
EFFECT = 0.2


def settings(seed: int = 0, **kw) -> Sampling:
    return Sampling(**{"temperature": TEMPERATURE, "top_k": TOP_K, "seed": seed, **kw})


@torch.inference_mode()
def exact_joint(model, prompt: list[int], s: Sampling, tokens: int = TOKENS) -> dict[tuple, float]:
    """P(t1..tn) = prod_i process(target logits after prompt + t1..t{i-1})[t_i], enumerated."""
    joint = {(): 1.0}
    for _ in range(tokens):
        nxt = {}
        for prefix, pr in joint.items():
            logits = model(torch.tensor([prompt + list(prefix)])).logits[0, -1]
            probs = process(logits, s)
            for t in probs.nonzero()[:, 0].tolist():
                nxt[prefix + (t,)] = pr * float(probs[t])
        joint = nxt
    return joint


def sample(model, prompt: list[int], make_proposer=None, n: int = SAMPLES, tokens: int = TOKENS,
           **sampling) -> tuple[dict[tuple, int], int, int]:
    """n seeded decodes through the loop (a fresh proposer from make_proposer(target), or plain
    sampling): outcome counts, accepted and drafted tokens."""
    target = TargetModel(model)
    proposer = make_proposer(target) if make_proposer else None
    counts: dict[tuple, int] = {}
    accepted = drafted = 0
    with torch.inference_mode():
        for seed in range(n):
            r = decode(target, prompt, tokens, set(), proposer, sampling=settings(seed, **sampling))
            out = tuple(r.output_ids[:tokens])
            counts[out] = counts.get(out, 0) + 1
            accepted, drafted = accepted + sum(r.accepted), drafted + sum(r.drafted)
    return counts, accepted, drafted


def chi_square(counts: dict[tuple, int], joint: dict[tuple, float]) -> tuple[float, int]:
    """(p-value, degrees of freedom) of the observed counts against the exact joint; p = 0 when a
    sample falls outside the support."""
    n = sum(counts.values())
    if set(counts) - set(joint):
        return 0.0, 0
    cells = sorted(joint, key=joint.get, reverse=True)
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for c in cells:
        if joint[c] * n >= 5:
            obs.append(counts.get(c, 0))
            exp.append(joint[c] * n)
        else:
            pool_o, pool_e = pool_o + counts.get(c, 0), pool_e + joint[c] * n
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    exp = [e * n / sum(exp) for e in exp]   # the enumerated probabilities sum to 1 up to rounding
    result = stats.chisquare(obs, exp)
    return float(result.pvalue), len(obs) - 1


def power(df: int, n: int = SAMPLES, effect: float = EFFECT, alpha: float = ALPHA) -> float:
    """Power of the chi-square test with df degrees of freedom against effect size w."""
    critical = stats.chi2.ppf(1 - alpha, df)
    return float(stats.ncx2.sf(critical, df, n * effect ** 2))
