"""Speculative sampling (T > 0): the verifier's rejection sampling is lossless in distribution.

Each test samples the first tokens through the decode loop N times and runs a chi-square test
against the target's exact joint distribution (sampling_check states N, the significance level
and the power). Proposers here are synthetic: chains and trees of point masses, and chains and
trees drawn from another model's distribution q. The negative controls are wrong verification
rules, run through the same loop and the same test, which must fail it. Every registered method
gets the same test in test_contract.py.
"""
import pytest
import torch

from conftest import tiny_llama
from sampling_check import ALPHA, EFFECT, SAMPLES, TOKENS, chi_square, exact_joint, power, sample, settings
from specdec.core import loop
from specdec.core.loop import Draft, decode
from specdec.core.sampling import Sampler, Sampling, process
from specdec.core.target import TargetModel
from specdec.core.verify import _remove

PROMPT = [5, 9, 12, 7, 30, 41]


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    return tiny_llama(0), tiny_llama(1)   # the target, and another model as a drafter's q


class ModelDrafter:
    """Drafts with a model over the whole sequence (slow, exact): `width` children per node at
    depth 1 and one below each, `depth` deep. sampled: children drawn independently from
    q = process(drafter logits) at the loop's settings (temperature scaled by q_temp); else the
    drafter's top tokens as point masses."""
    tap_layers = ()
    drafts_from_prompt = False

    def __init__(self, model, depth=2, width=1, sampled=True, q_temp=1.0):
        self.model, self.depth, self.width, self.sampled, self.q_temp = model, depth, width, sampled, q_temp

    def start(self, prompt_ids, hidden, sampler=None):
        self.sampler = sampler

    def _q(self, ids):
        logits = self.model(torch.tensor([ids])).logits[0, -1]
        if self.sampler is None:   # greedy decoding
            return logits.softmax(-1)
        s = self.sampler.settings
        return process(logits, Sampling(s.temperature * self.q_temp, s.top_p, s.top_k))

    def propose(self, ids, max_depth=None):
        tokens, parents, qs = [], [], []
        for w in range(self.width):
            seq, parent = list(ids), -1
            for d in range(self.depth):
                q = self._q(seq)
                n = w if d == 0 else 0
                x = self.sampler.draw(q) if self.sampled else int(q.topk(n + 1).indices[n])
                tokens.append(x)
                parents.append(parent)
                qs.append(q)
                parent, seq = len(tokens) - 1, seq + [x]
        return Draft(tokens, parents, torch.stack(qs) if self.sampled else None)

    def observe(self, step):
        pass


def check(model, make_proposer, **sampling):
    joint = exact_joint(model, PROMPT, settings(**sampling))
    counts, accepted, drafted = sample(model, PROMPT, make_proposer, **sampling)
    pvalue, df = chi_square(counts, joint)
    return pvalue, df, accepted, drafted


def test_power_of_the_distribution_test():
    """With N samples over at most 27 cells, the test at ALPHA detects an effect of size EFFECT
    with probability above 0.99."""
    assert power(df=3 ** TOKENS - 1) > 0.99
    assert SAMPLES * EFFECT ** 2 > 0


def test_processing():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    assert torch.allclose(process(logits, Sampling(1.0)), logits.softmax(-1))
    assert torch.allclose(process(logits, Sampling(0.5)), (logits / 0.5).softmax(-1))
    top2 = process(logits, Sampling(1.0, top_k=2))
    assert top2[2:].sum() == 0 and torch.allclose(top2[:2], logits[:2].softmax(-1))
    p = logits.softmax(-1)                            # 0.644, 0.237, 0.087, 0.032
    nucleus = process(logits, Sampling(1.0, top_p=0.85))
    assert (nucleus > 0).tolist() == [True, True, False, False]   # 0.644 < 0.85 <= 0.881
    assert torch.allclose(nucleus[:2], p[:2] / p[:2].sum())
    with pytest.raises(ValueError, match="top_p"):
        Sampling(1.0, top_p=0.0)
    with pytest.raises(ValueError, match="temperature > 0"):
        Sampler(Sampling(0.0))


def test_residual():
    r = torch.tensor([0.5, 0.3, 0.2])
    assert torch.allclose(_remove(r, 0, None), torch.tensor([0.0, 0.6, 0.4]))
    assert torch.allclose(_remove(r, 1, torch.tensor([0.1, 0.8, 0.1])), torch.tensor([0.4, 0.0, 0.1]) / 0.5)


def test_a_seed_repeats_a_run(models):
    target, other = models
    runs = [decode(TargetModel(target), PROMPT, 12, set(), ModelDrafter(other),
                   sampling=settings(seed, temperature=1.0)) for seed in (7, 7, 8)]
    assert runs[0].output_ids == runs[1].output_ids and runs[0].accepted == runs[1].accepted
    assert runs[0].output_ids != runs[2].output_ids


def test_greedy_is_temperature_zero(models):
    target, other = models
    greedy = decode(TargetModel(target), PROMPT, 12, set(), ModelDrafter(other, sampled=False))
    zero = decode(TargetModel(target), PROMPT, 12, set(), ModelDrafter(other, sampled=False),
                  sampling=Sampling(0.0, seed=3))
    assert greedy.output_ids == zero.output_ids == decode(TargetModel(target), PROMPT, 12, set()).output_ids


@pytest.mark.parametrize("case", [
    "plain sampling",
    "chain drawn from q",
    "chain of the drafter's top tokens",
    "tree of point masses",
    "tree drawn from q",
    "chain drawn from q, top-p",
])
def test_speculative_sampling_matches_the_target(models, case):
    target, other = models
    proposers = {
        "plain sampling": None,
        "chain drawn from q": lambda t: ModelDrafter(other, depth=3),
        "chain of the drafter's top tokens": lambda t: ModelDrafter(other, depth=3, sampled=False),
        # siblings: the target's own top-2 tokens, so both are often tested
        "tree of point masses": lambda t: ModelDrafter(target, width=2, sampled=False),
        "tree drawn from q": lambda t: ModelDrafter(other, width=3, q_temp=2.0),
        "chain drawn from q, top-p": lambda t: ModelDrafter(other, depth=3),
    }
    # top-p at a higher temperature: 0.8 of the mass spans several tokens per step (54 cells)
    extra = {"temperature": 0.1, "top_p": 0.8, "top_k": 0} if "top-p" in case else {}
    pvalue, df, accepted, drafted = check(target, proposers[case], **extra)
    assert pvalue > ALPHA, f"{case}: p = {pvalue:.2g} over {df} degrees of freedom"
    if proposers[case] is not None:
        assert 0 < accepted < drafted, f"{case}: the test needs both acceptances and rejections"


# ---- negative controls: wrong rules the same test must catch ------------------------------------
def always_accept(tokens, parents, q, p, sampler):
    """Accept every draft token along the first children; the bonus token from p."""
    path, node = [0], 0
    while (kids := [i for i in range(1, len(tokens)) if parents[i] == node]):
        node = kids[0]
        path.append(node)
    return path, sampler.draw(p[node])


def accept_if_argmax(tokens, parents, q, p, sampler):
    """Accept a draft token when it is the target's argmax; otherwise sample from p."""
    path, node = [0], 0
    while True:
        best = int(p[node].argmax())
        nxt = next((c for c in range(1, len(tokens)) if parents[c] == node and tokens[c] == best), None)
        if nxt is None:
            return path, sampler.draw(p[node])
        path.append(nxt)
        node = nxt


def forget_rejected_siblings(tokens, parents, q, p, sampler):
    """Recursive rejection sampling that tests every sibling against p itself and draws the
    replacement from p: rejected siblings' mass is never removed."""
    path, node = [0], 0
    while True:
        for c in (i for i in range(1, len(tokens)) if parents[i] == node):
            qx = 1.0 if q is None else float(q[c - 1, tokens[c]])
            if sampler.uniform() * qx < float(p[node, tokens[c]]):
                path.append(c)
                node = c
                break
        else:
            return path, sampler.draw(p[node])


@pytest.mark.parametrize("rule, case", [
    (always_accept, "chain drawn from q"),
    (accept_if_argmax, "chain drawn from q"),
    (accept_if_argmax, "chain of the target's greedy tokens"),
    (forget_rejected_siblings, "tree of point masses"),
])
def test_negative_controls_fail(models, monkeypatch, rule, case):
    target, other = models
    proposers = {
        "chain drawn from q": lambda t: ModelDrafter(other, depth=3),
        "chain of the target's greedy tokens": lambda t: ModelDrafter(target, depth=3, sampled=False),
        "tree of point masses": lambda t: ModelDrafter(target, width=2, sampled=False),
    }
    monkeypatch.setattr(loop, "verify_sampled", rule)
    pvalue, df, _, _ = check(target, proposers[case])
    assert pvalue < ALPHA, f"{rule.__name__} on {case} passed the test: p = {pvalue:.2g}"
