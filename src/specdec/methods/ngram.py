"""N-gram prompt lookup (training-free).

Find the most recent earlier occurrence of the longest suffix n-gram of the context
(n from prompt_lookup_max down to prompt_lookup_min) in the prompt plus the accepted history,
and draft the up to `draft_len` tokens that followed it. An index maps every n-gram to the
position after its latest occurrence, so one proposal is O(prompt_lookup_max) dict lookups.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.loop import Draft, StepResult, draft_limit
from . import VllmServing


@dataclass
class NgramConfig:
    draft_len: int = 5
    prompt_lookup_min: int = 3
    prompt_lookup_max: int = 8

    def __post_init__(self):
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(f"ngram: need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                             f"{self.prompt_lookup_min}, {self.prompt_lookup_max}")
        if self.draft_len < 1:
            raise ValueError(f"ngram: draft_len must be >= 1, got {self.draft_len}")


class NgramProposer:
    tap_layers = ()
    drafts_from_prompt = True  # no target state needed: the first step verifies a draft

    def __init__(self, cfg: NgramConfig):
        self.cfg = cfg
        self.draft_shape = f"chain k={cfg.draft_len}"
        self.ids: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}  # n-gram -> end position of its latest occurrence
        self.indexed = 0  # n-grams ending before this position are in the index

    def start(self, prompt_ids, hidden=None, sampler=None) -> None:
        # drafts are copies of earlier tokens: point masses, lossless under sampling too
        self.ids, self.index, self.indexed = [], {}, 0

    def _index_until(self, end: int) -> None:
        ids, lo, hi = self.ids, self.cfg.prompt_lookup_min, self.cfg.prompt_lookup_max
        for e in range(self.indexed, end):  # n-grams ids[e-n+1 : e+1]
            for n in range(lo, min(hi, e + 1) + 1):
                self.index[tuple(ids[e - n + 1: e + 1])] = e + 1
        self.indexed = max(self.indexed, end)

    def propose(self, ids: list[int], max_depth: int | None = None) -> Draft | None:
        self.ids = ids
        last = len(ids) - 1
        self._index_until(last)  # every n-gram except those ending at the last token
        for n in range(min(self.cfg.prompt_lookup_max, len(ids)), self.cfg.prompt_lookup_min - 1, -1):
            start = self.index.get(tuple(ids[-n:]))
            if start is not None:
                return Draft.chain(ids[start: start + draft_limit(self.cfg.draft_len, max_depth)])
        return None

    def observe(self, step: StepResult) -> None:
        pass


NAME = "ngram"
PARAMS = NgramConfig
EXAMPLE = {"params": {"draft_len": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 4}}
VLLM = VllmServing(hook=True)


def vllm_config(p: NgramConfig, export_dir=None) -> dict:
    return {"method": "ngram", "num_speculative_tokens": p.draft_len,
            "prompt_lookup_min": p.prompt_lookup_min, "prompt_lookup_max": p.prompt_lookup_max}


def build(params: dict, target=None) -> NgramProposer:
    return NgramProposer(NgramConfig(**params))


def tuning_grid(p: NgramConfig) -> dict:
    # a longer draft costs no drafting time, only a wider verification forward
    return {"draft_len": [2, 3, 5, 8]}
