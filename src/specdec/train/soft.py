"""Soft labels: distillation on the target's top-K next-token distribution instead of its argmax.

The hidden-state cache keeps, at every labelled position, the target's K most likely next tokens
and their log-probabilities under its full softmax (train/hidden.py, `soft_topk`). A drafter
trained with `train.soft_labels` minimises the cross-entropy to that distribution, renormalised
over the top-K tokens the drafter can emit (a reduced draft vocabulary drops the others):

    q(v) = p_target(v) / sum_{u in top-K, u emittable} p_target(u)
    loss = - sum_v q(v) log p_drafter(v)          (forward KL(q || p_drafter) + H(q))

which is the top-K distillation of HASS, and the hard-label cross-entropy when K = 1.
"""
from __future__ import annotations

import torch


def soft_cross_entropy(logits: torch.Tensor, ids: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """logits (N, V') over the drafter's vocabulary; ids (N, K) the target's top K as indices into
    it (< 0: padding, or a token outside the drafter's vocabulary); logp (N, K) their target
    log-probabilities. Mean over the rows with at least one emittable token (0 if none)."""
    ok = ids >= 0
    rows = ok.any(-1)
    if not rows.any():
        return logits.sum() * 0
    ok, ids, logp, logits = ok[rows], ids[rows].long(), logp[rows].float(), logits[rows].float()
    q = torch.softmax(logp.masked_fill(~ok, float("-inf")), -1)           # (n, K), renormalised
    logp_draft = torch.log_softmax(logits, -1).gather(-1, ids.clamp(min=0))  # (n, K)
    return -(q * logp_draft.masked_fill(~ok, 0)).sum(-1).mean()


def to_drafter(ids: torch.Tensor, t2d: torch.Tensor) -> torch.Tensor:
    """Target token ids (-1: none) -> drafter indices through t2d (target id -> index, -1 outside
    the drafter's vocabulary)."""
    ids = ids.long()
    return torch.where(ids >= 0, t2d.to(ids.device)[ids.clamp(min=0)], ids.new_full((), -1))


def padded_soft(seqs, n: int, columns=None, skip=None, shifted: bool = True):
    """The sequences' soft labels as padded (B, n, K) ids (-1 where none) and logp (-inf): those of
    Sequence.soft_targets (shifted, aligned with Sequence.targets) or Sequence.soft (aligned with
    Sequence.labels); sequence b's from its token skip[b] on, written from column columns[b] (both
    0 when None). None when the sequences carry no soft labels."""
    if not seqs or seqs[0].soft is None:
        return None
    K = seqs[0].soft[0].shape[1]
    ids = torch.full((len(seqs), n, K), -1, dtype=torch.int32)
    logp = torch.full((len(seqs), n, K), float("-inf"))
    for b, s in enumerate(seqs):
        sid, slp = s.soft_targets if shifted else s.soft
        a, o = (0 if skip is None else int(skip[b])), (0 if columns is None else int(columns[b]))
        ids[b, o:o + len(sid) - a], logp[b, o:o + len(sid) - a] = sid[a:], slp[a:]
    return ids, logp
