"""The lossless property: whatever a proposer drafts, greedy output equals the baseline (fp32)."""
import random

import pytest

from specdec.core.loop import Draft, decode, draft_limit
from specdec.core.target import TargetModel
from specdec.methods.ngram import NgramConfig, NgramProposer
from specdec.methods.suffix import SuffixConfig, SuffixProposer

EOS = {2}


class RandomChain:
    tap_layers = ()
    drafts_from_prompt = False

    def __init__(self, seed, vocab=64, k=5):
        self.rng, self.vocab, self.k = random.Random(seed), vocab, k

    def start(self, prompt_ids, hidden, sampler=None):
        pass

    def propose(self, ids, max_depth=None):  # ignores max_depth: the loop prunes
        return Draft.chain([self.rng.randrange(self.vocab) for _ in range(self.rng.randint(0, self.k))])

    def observe(self, step):
        pass


class RandomTree(RandomChain):
    def propose(self, ids, max_depth=None):
        n = self.rng.randint(1, 10)
        parents = [-1] + [self.rng.randrange(-1, i) for i in range(1, n)]
        return Draft([self.rng.randrange(self.vocab) for _ in range(n)], parents)


class Oracle(RandomChain):
    """Knows the baseline output: drafts it, corrupting one token now and then, sometimes as a
    tree whose correct branch is not the first child, sometimes including EOS."""

    def __init__(self, seed, reference):
        super().__init__(seed)
        self.reference = reference

    def start(self, prompt_ids, hidden, sampler=None):
        self.prompt_len = len(prompt_ids)

    def propose(self, ids, max_depth=None):
        done = len(ids) - self.prompt_len
        truth = self.reference[done: done + self.rng.randint(1, 8)]
        if not truth:
            return Draft.chain([2, 2, 2])  # drafts past the end (EOS) are still verified
        chain = list(truth)
        if self.rng.random() < 0.3:
            chain[self.rng.randrange(len(chain))] = self.rng.randrange(self.vocab)
        if self.rng.random() < 0.5:
            return Draft.chain(chain)
        # decoy branch first, then the (possibly corrupted) truth as a second branch
        decoy = [(t + 1) % self.vocab for t in chain[:2]]
        d = len(decoy)
        return Draft(decoy + chain, list(range(-1, d - 1)) + [-1] + list(range(d, d + len(chain) - 1)))


def baseline(target, prompt, max_new):
    return decode(target, prompt, max_new, EOS).output_ids


def from_prompt(proposer, on=True):
    """The proposer drafts from the prompt: the first step verifies a draft with the last prompt
    token pending (the loop prefills all but that token)."""
    proposer.drafts_from_prompt = on
    return proposer


@pytest.mark.parametrize("early", [False, True], ids=["after_prefill", "from_prompt"])
@pytest.mark.parametrize("max_new", [1, 7, 40])
def test_adversarial_proposers_are_lossless(tiny_model, max_new, early):
    target = TargetModel(tiny_model)
    rng = random.Random(max_new)
    for trial in range(3):
        # prompt lengths from 1: drafting from a one-token prompt starts from an empty cache
        prompt = [rng.randrange(3, 64) for _ in range(1 if trial == 0 else rng.randint(2, 20))]
        ref = baseline(target, prompt, max_new)
        assert len(ref) <= max_new
        for proposer in (RandomChain(trial), RandomTree(trial), Oracle(trial, ref)):
            out = decode(target, prompt, max_new, EOS, from_prompt(proposer, early))
            assert out.output_ids == ref, type(proposer).__name__
            assert len(out.drafted) == len(out.accepted)
            assert all(0 <= a <= d for a, d in zip(out.accepted, out.drafted))
            # every step emits its accepted drafts plus one target token (except a cut at the end)
            assert sum(out.accepted) + len(out.drafted) >= len(ref) - 1


def test_oracle_accepts_long_runs(tiny_model):
    target = TargetModel(tiny_model)
    prompt = [5, 9, 11, 13]
    ref = baseline(target, prompt, 40)

    class Perfect(Oracle):
        def propose(self, ids, max_depth=None):
            done = len(ids) - self.prompt_len
            return Draft.chain(self.reference[done: done + 4]) if self.reference[done:done + 4] else None

    out = decode(target, prompt, 40, EOS, Perfect(0, ref))
    assert out.output_ids == ref
    assert len(out.drafted) < len(ref) / 3  # 4 drafts + 1 bonus per step


def test_drafts_past_max_new_tokens_are_pruned(tiny_model):
    """A step emits its accepted drafts + 1: the loop asks for no deeper draft than can still be
    emitted and prunes what a proposer drafts past it, so no verified token is wasted."""
    target = TargetModel(tiny_model)
    prompt = [5, 9, 11, 13]
    ref = decode(target, prompt, 10, set()).output_ids

    class Perfect4:
        tap_layers = ()
        drafts_from_prompt = False
        asked = []

        def start(self, prompt_ids, hidden, sampler=None):
            self.prompt_len = len(prompt_ids)

        def propose(self, ids, max_depth=None):
            self.asked.append(max_depth)
            done = len(ids) - self.prompt_len
            tree = Draft(ref[done: done + 4] + [0], [-1, 0, 1, 2, 0])   # a 4-deep path + a leaf
            return tree

        def observe(self, step):
            pass

    out = decode(target, prompt, 10, set(), Perfect4())
    assert out.output_ids == ref
    # 1 token from the prefill (9 left: 8 drafts + 1), then 4 accepted + 1, then 4 left: 3 drafts
    assert Perfect4.asked == [8, 3] and out.drafted == [5, 4] and out.accepted == [4, 3]
    assert out.depth == [4, 3]


def test_drafting_from_the_prompt_verifies_the_first_draft_in_the_first_step(tiny_model):
    target = TargetModel(tiny_model)
    prompt = [5, 9, 11, 13]
    ref = baseline(target, prompt, 12)
    forwards = []
    hook = tiny_model.register_forward_pre_hook(
        lambda m, a, kw: forwards.append(kw["input_ids"].shape[1]), with_kwargs=True)
    out = decode(target, prompt, 12, EOS, from_prompt(Oracle(0, ref)))
    assert out.output_ids == ref
    # one forward per step: the first one runs the prompt and the first draft together
    assert forwards[0] == len(prompt) + out.drafted[0] and len(forwards) == len(out.drafted)
    assert out.fused_first_step and out.accepted[0] > 0   # the first step emitted several tokens
    assert 0 < out.ttft_s < out.wall_s
    # the plain path: a prefill forward gives the first token, then one forward per step
    forwards.clear()
    plain = decode(target, prompt, 12, EOS, from_prompt(Oracle(0, ref), on=False))
    hook.remove()
    assert plain.output_ids == ref and not plain.fused_first_step
    assert forwards[0] == len(prompt) and len(forwards) == 1 + len(plain.drafted)


def test_drafting_from_the_prompt_refuses_a_proposer_that_reads_target_state(tiny_model):
    proposer = from_prompt(RandomChain(0))
    proposer.tap_layers = (1,)
    with pytest.raises(ValueError, match="tap layers"):
        decode(TargetModel(tiny_model), [5, 9], 4, EOS, proposer)


def test_draft_prune_keeps_shallow_nodes_and_reindexes_parents():
    d = Draft([10, 11, 12, 13, 14], [-1, 0, -1, 1, 2])   # depths 1, 2, 1, 3, 2
    assert d.prune(3) is d
    p = d.prune(2)
    assert p.tokens == [10, 11, 12, 14] and p.parents == [-1, 0, -1, 2]
    assert d.prune(1).tokens == [10, 12] and d.prune(1).parents == [-1, -1]
    assert draft_limit(5, None) == 5 and draft_limit(5, 3) == 3 and draft_limit(2, 8) == 2


def test_eos_stops_exactly_like_greedy(tiny_model):
    target = TargetModel(tiny_model)
    # find a prompt whose greedy output hits EOS: use the model's own argmax to pick one
    eos_model = {int(decode(target, [7, 8, 9], 1, set()).output_ids[0])}
    ref = decode(target, [7, 8, 9], 20, eos_model).output_ids
    assert ref[-1] in eos_model and len(ref) == 1
    out = decode(target, [7, 8, 9], 20, eos_model, RandomTree(3))
    assert out.output_ids == ref


@pytest.mark.parametrize("make", [
    lambda: NgramProposer(NgramConfig(draft_len=5, prompt_lookup_min=1, prompt_lookup_max=4)),
    lambda: SuffixProposer(SuffixConfig(draft_len=8, max_tree_depth=6)),
    lambda: SuffixProposer(SuffixConfig(draft_len=4, max_tree_depth=8, global_cache=True)),
])
def test_training_free_methods_are_lossless(tiny_model, make):
    target = TargetModel(tiny_model)
    proposer = make()
    rng = random.Random(5)
    for _ in range(3):
        motif = [rng.randrange(3, 64) for _ in range(6)]
        prompt = motif * 4 + [rng.randrange(3, 64)]  # repetitive: the proposers find matches
        ref = baseline(target, prompt, 48)
        out = decode(target, prompt, 48, EOS, proposer)
        assert out.output_ids == ref
        assert sum(out.drafted) > 0
