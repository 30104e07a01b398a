"""One decode loop for every method: propose -> verify -> commit -> observe.

With no proposer (or an empty draft) a step is plain decoding: one target forward of the pending
token. The autoregressive baseline is exactly that path, so a method's speedup measures its
proposer and nothing else. Greedy (no sampling, or temperature 0) takes argmaxes; with T > 0 the
loop samples through one seeded Sampler per sequence and the verifier's rejection sampling keeps
the output distributed as the target's own samples.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .sampling import Sampler, Sampling
from .target import TargetModel
from .tree import depths, is_chain
from .verify import verify_chain, verify_sampled, verify_tree


@dataclass
class Draft:
    """Draft tokens after the pending token. parents[i] == -1 attaches token i to the pending
    token; otherwise parents[i] < i indexes another draft token. A chain is [-1, 0, 1, ...].
    q (sampling only): (len(tokens), V), q[i] the processed draft distribution token i was drawn
    from; None: each token is a point mass (a deterministic draft)."""
    tokens: list[int]
    parents: list[int]
    q: torch.Tensor | None = None

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"draft has {len(self.tokens)} tokens but {len(self.parents)} parents")
        if self.q is not None and self.q.shape[0] != len(self.tokens):
            raise ValueError(f"draft has {len(self.tokens)} tokens but {self.q.shape[0]} draft distributions")
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"draft token {i} has parent {p}: parents must come first (or be -1)")

    @classmethod
    def chain(cls, tokens: list[int], q: torch.Tensor | None = None) -> Draft:
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), q)

    def __len__(self) -> int:
        return len(self.tokens)

    def prune(self, max_depth: int) -> Draft:
        """The nodes at depth <= max_depth (depth 1: children of the pending token)."""
        depth = depths([-1] + [p + 1 for p in self.parents])[1:]   # node 0 is the pending token
        kept = [i for i, d in enumerate(depth) if d <= max_depth]   # parents come first, so kept too
        if len(kept) == len(self.tokens):
            return self
        index = {i: j for j, i in enumerate(kept)}
        parents = [-1 if self.parents[i] < 0 else index[self.parents[i]] for i in kept]
        return Draft([self.tokens[i] for i in kept], parents, None if self.q is None else self.q[kept])


def draft_limit(draft_len: int, max_depth: int | None) -> int:
    """How many tokens a chain proposer drafts (or how deep a tree): its own draft_len, capped
    by the loop's max_depth (None: no cap)."""
    return draft_len if max_depth is None else min(draft_len, max_depth)


@dataclass
class StepResult:
    """What a proposer is told after verification."""
    accepted: list[int]          # draft tokens that were accepted, in order
    next_token: int              # the target's token after them (the new pending token)
    hidden: dict[int, torch.Tensor] | None  # tap layer -> hidden states of [pending, *accepted]


class Proposer(Protocol):
    tap_layers: tuple[int, ...]  # target layers whose hidden states the proposer reads
    # True: the proposer drafts without any target state, so the first step can already verify a
    # draft of the prompt's continuation (see decode); start() then gets the whole prompt but
    # propose() is first called with ids == the prompt, its last token pending
    drafts_from_prompt: bool

    def start(self, prompt_ids: list[int], hidden: dict[int, torch.Tensor] | None,
              sampler: Sampler | None = None) -> None:
        """A new sequence. `sampler` (T > 0): a drafter that samples its drafts draws them with
        it, from sampler.probs(its logits), and returns those distributions as Draft.q; None:
        greedy decoding, draft the argmaxes."""

    def propose(self, ids: list[int], max_depth: int | None = None) -> Draft | None:
        """Draft a continuation of `ids` (prompt + every emitted token, the last one pending).
        Tokens deeper than `max_depth` could not be emitted (the step would pass max_new_tokens):
        a proposer may skip drafting them; the loop prunes them before verification."""

    def observe(self, step: StepResult) -> None: ...


@dataclass
class DecodeResult:
    output_ids: list[int]
    wall_s: float
    ttft_s: float        # time to the first new token
    draft_s: float       # time inside the proposer after the first token
    fused_first_step: bool = False   # the prefill's forward verified the first draft
    drafted: list[int] = field(default_factory=list)   # draft tokens per verification step
    accepted: list[int] = field(default_factory=list)  # accepted draft tokens per step
    depth: list[int] = field(default_factory=list)     # draft depth per step (chain: its length)


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """The argmax over the last dim, taken in fp32: widening bf16 is exact, so the index is the
    same (the first maximum), and torch's CPU argmax over a 49k vocabulary costs about 3x as much
    in bf16 as the widening and an fp32 argmax together."""
    return logits.float().argmax(dim=-1)


def _next_token(logits: torch.Tensor, sampler: Sampler | None) -> int:
    """The target's token after one position's (V,) logits: its argmax, or a sample."""
    return int(_argmax(logits)) if sampler is None else sampler.draw(sampler.probs(logits))


def verify_step(target: TargetModel, pending: int, draft: Draft | None, taps, sampler: Sampler | None):
    """One target forward of the pending token and the draft (a plain decoding step without one).
    Returns (emitted tokens: accepted drafts + the target's next token, accepted path length
    including the pending token, hidden taps of the accepted path, draft depth)."""
    if not draft:
        # plain decoding step: the baseline's whole loop body
        logits, hidden = target.forward([pending], None, taps)
        target.commit(None)
        return [_next_token(logits[-1], sampler)], 1, hidden, 0
    nodes = [pending] + draft.tokens
    parents = [-1] + [p + 1 for p in draft.parents]
    chain = is_chain(parents)
    logits, hidden = target.forward(nodes, None if chain else parents, taps)
    if sampler is not None:
        path, nxt = verify_sampled(nodes, parents, draft.q, sampler.probs(logits), sampler)
    elif chain:
        path, nxt = verify_chain(draft.tokens, _argmax(logits).tolist())
    else:
        path, nxt = verify_tree(nodes, parents, _argmax(logits).tolist())
    target.commit(path)  # keep only the accepted path's KV
    if hidden is not None:
        index = torch.tensor(path)
        hidden = {k: v[index] for k, v in hidden.items()}
    depth = len(draft) if chain else max(depths(parents))
    return [nodes[i] for i in path[1:]] + [nxt], len(path), hidden, depth


def _stop(emitted: list[int], room: int, eos_ids: set[int]) -> list[int]:
    """Cut a step's tokens where plain greedy decoding would stop: after `room` tokens
    (max_new_tokens) or at the first EOS, inclusive."""
    emitted = emitted[:room]
    for j, tok in enumerate(emitted):
        if tok in eos_ids:
            return emitted[: j + 1]
    return emitted


@torch.inference_mode()
def decode(target: TargetModel, prompt_ids: list[int], max_new_tokens: int,
           eos_ids: set[int], proposer: Proposer | None = None,
           on_tokens: Callable[[list[int]], None] | None = None,
           sampling: Sampling | None = None) -> DecodeResult:
    """Decoding of up to max_new_tokens (stopping after an EOS), with `proposer`'s drafts verified
    each step: greedy, or sampled when `sampling` has T > 0 (seeded: a seed repeats the output).
    `on_tokens` gets each step's new tokens as they are emitted (streaming)."""
    clock = time.perf_counter
    t0 = clock()
    sampler = None if sampling is None or sampling.greedy else Sampler(sampling, target.device)
    taps = proposer.tap_layers if proposer is not None else ()
    res = DecodeResult([], 0.0, None, 0.0)
    out = res.output_ids
    res.fused_first_step = proposer is not None and proposer.drafts_from_prompt
    if res.fused_first_step:
        if taps:
            raise ValueError(f"{type(proposer).__name__}: drafts_from_prompt needs no target state, "
                             f"but it reads tap layers {taps}")
        # the first step verifies a draft of the prompt's continuation in the prefill's own
        # forward (as transformers' assisted generation does): the last prompt token is the
        # pending token, the rest of the prompt runs in front of it, and a first step that
        # accepts k drafts emits k+1 tokens instead of the prefill's 1
        target.prefill(prompt_ids[:-1], defer=True)
        pending, hidden = prompt_ids[-1], None
    else:
        logits, hidden = target.prefill(prompt_ids, taps)
        pending = _next_token(logits[-1], sampler)
        out.append(pending)
        res.ttft_s = clock() - t0
        if on_tokens is not None:
            on_tokens([pending])
    ids = list(prompt_ids) + out
    draft_s = 0.0
    if proposer is not None:
        t = clock()
        proposer.start(list(prompt_ids), hidden, sampler)
        draft_s += clock() - t

    while len(out) < max_new_tokens and (not out or pending not in eos_ids):
        draft = None
        # a step emits its accepted drafts + 1 token: drafts deeper than this cannot be emitted
        max_depth = max_new_tokens - len(out) - 1
        if proposer is not None and max_depth > 0:
            t = clock()
            draft = proposer.propose(ids, max_depth)
            draft_s += clock() - t
            if draft:
                draft = draft.prune(max_depth)
        emitted, path_len, hidden, depth = verify_step(target, pending, draft, taps, sampler)
        emitted = _stop(emitted, max_new_tokens - len(out), eos_ids)
        res.drafted.append(len(draft) if draft else 0)
        res.depth.append(depth)
        res.accepted.append(min(path_len - 1, len(emitted)))
        out.extend(emitted)
        ids.extend(emitted)
        pending = emitted[-1]
        if res.ttft_s is None:
            res.ttft_s = clock() - t0
            draft_s = 0.0   # the fused first step's drafting is part of the time to first token
        if on_tokens is not None:
            on_tokens(emitted)
        if proposer is not None:
            t = clock()
            proposer.observe(StepResult(emitted[:-1] if draft else [], pending, hidden))
            draft_s += clock() - t

    res.wall_s = clock() - t0
    res.draft_s = draft_s
    return res
