"""The null drafter: a negative control, not a method.

Every step drafts `draft_len` copies of one token the target never emits in greedy decoding
(`token_id`: for SmolLM2, 16, `<empty_output>`, which no chat text contains), so every draft is
rejected and every step emits exactly the target's own token, as a plain step does, but through a
verify forward of 1 + draft_len tokens. Its speedup is the yardstick's own cost of verification:
it must read at most 1.0x. A row above 1.0 says the measurement favours multi-token forwards (or
the machine was disturbed), not that drafting helps. The drafts are point masses, so sampled rows
stay lossless (the verifier rejects them with probability 1 - p(token_id)).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.loop import Draft, StepResult, draft_limit
from . import VllmServing


@dataclass
class NullConfig:
    token_id: int                 # a token the target never emits here (its drafts are all rejected)
    draft_len: int = 1

    def __post_init__(self):
        if self.draft_len < 1:
            raise ValueError(f"null_drafter: draft_len must be >= 1, got {self.draft_len}")
        if self.token_id < 0:
            raise ValueError(f"null_drafter: token_id must be a token id, got {self.token_id}")


class NullProposer:
    tap_layers = ()
    drafts_from_prompt = True  # needs no target state

    def __init__(self, cfg: NullConfig):
        self.cfg = cfg
        self.draft_shape = f"chain k={cfg.draft_len} (never accepted)"

    def start(self, prompt_ids, hidden=None, sampler=None) -> None:
        pass

    def propose(self, ids: list[int], max_depth: int | None = None) -> Draft | None:
        return Draft.chain([self.cfg.token_id] * draft_limit(self.cfg.draft_len, max_depth))

    def observe(self, step: StepResult) -> None:
        pass


NAME = "null_drafter"
CONTROL = True   # a negative control: its drafts are never meant to be accepted
PARAMS = NullConfig
EXAMPLE = {"params": {"token_id": 0, "draft_len": 3}}
VLLM = VllmServing(hook=True, native=False)   # vLLM has no null drafter: ours runs inside it


def vllm_config(p: NullConfig, export_dir=None) -> dict:
    """The draft length vLLM's custom proposer hook asks for (backends/vllm_hook.py)."""
    return {"num_speculative_tokens": p.draft_len}


def build(params: dict, target=None) -> NullProposer:
    return NullProposer(NullConfig(**params))
