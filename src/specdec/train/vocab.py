"""A reduced draft vocabulary: the tokens a drafter may propose, ranked by frequency in the
training set (as EAGLE-3's d2t / FR-Spec do). A head over V' << V rows costs V'/V of a full LM
head per step; verification stays with the target's full vocabulary, so output is unchanged."""
from __future__ import annotations

import torch


def frequent_tokens(seqs, size: int, vocab_size: int) -> torch.Tensor:
    """Ascending ids of the `size` most frequent of the target's labels over the training
    sequences: what a drafter is asked to predict (prompt tokens, which it never drafts, do not
    count; ties and unseen tokens by lower id)."""
    if not 1 <= size <= vocab_size:
        raise ValueError(f"draft vocabulary size {size} must be in 1..{vocab_size}")
    counts = torch.bincount(torch.cat([s.labels[s.labels >= 0] for s in seqs]), minlength=vocab_size).double()
    counts -= torch.arange(vocab_size, dtype=torch.double) / (2 * vocab_size)  # ties: lower id first
    return counts.topk(size).indices.sort().values


def target_to_draft(vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """t2d[target id] = draft index, or -1 where the token is not in the draft vocabulary."""
    t2d = torch.full((vocab_size,), -1, dtype=torch.long)
    t2d[vocab] = torch.arange(len(vocab))
    return t2d


def coverage(seqs, vocab: torch.Tensor, vocab_size: int) -> float:
    """Share of the labels (the target's tokens at the completion positions) inside the draft vocabulary."""
    t2d = target_to_draft(vocab, vocab_size)
    labels = torch.cat([s.labels[s.labels >= 0] for s in seqs])
    return (t2d[labels] >= 0).double().mean().item() if len(labels) else float("nan")
