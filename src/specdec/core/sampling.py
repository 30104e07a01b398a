"""Sampling settings and the seeded sampler the loop, the verifier and the drafters share.

Greedy decoding is temperature 0 (no sampler at all: the loop takes argmaxes). With T > 0 every
distribution, the target's and each drafter's, gets the same processing: logits / T, then top-k
(keep the k largest), then top-p (keep the smallest set of most probable tokens whose mass
reaches p), renormalised. One torch.Generator seeded per sequence draws every random number of
that sequence (draft tokens, acceptance tests, residual and bonus tokens), so a seed repeats a
sequence exactly.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0   # 0: greedy
    top_p: float = 1.0         # 1: off
    top_k: int = 0             # 0: off
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"sampling: temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling: top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"sampling: top_k must be >= 0 (0: off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def for_prompt(self, index: int) -> Sampling:
        """Prompt `index` of a data set samples with seed + index: every prompt its own stream,
        every run the same streams."""
        return Sampling(self.temperature, self.top_p, self.top_k, self.seed + index)

    def to_dict(self) -> dict:
        return asdict(self)


def process(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """(..., V) logits -> (..., V) float32 probabilities after temperature, top-k and top-p."""
    x = logits.float() / s.temperature
    if s.top_k and s.top_k < x.shape[-1]:
        kth = x.topk(s.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))            # keep the k largest (and ties)
    if s.top_p < 1:
        sorted_x, order = x.sort(dim=-1, descending=True)
        mass_before = sorted_x.softmax(-1).cumsum(-1) - sorted_x.softmax(-1)
        drop = mass_before >= s.top_p                          # the mass already reached p
        x = x.scatter(-1, order, sorted_x.masked_fill(drop, float("-inf")))
    return x.softmax(-1)


class Sampler:
    """One sequence's sampler: processing as `Sampling` says, draws from one seeded generator."""

    def __init__(self, s: Sampling, device: torch.device | str = "cpu"):
        if s.greedy:
            raise ValueError("a Sampler is for temperature > 0; greedy decoding takes argmaxes")
        self.settings = s
        self.generator = torch.Generator(device).manual_seed(s.seed)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return process(logits, self.settings)

    def sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row of (..., V) logits, drawn from their processed distribution q:
        (tokens (...), q (..., V)); a drafter's draft and the q it hands the verifier."""
        q = self.probs(logits)
        tokens = torch.multinomial(q.reshape(-1, q.shape[-1]), 1, generator=self.generator)
        return tokens.view(q.shape[:-1]), q

    def draw(self, probs: torch.Tensor) -> int:
        """One token from a (V,) distribution."""
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator, device=self.generator.device))
