"""Standard speculative decoding with a standalone draft LM (draft_lm.py builds and trains it).

Each step the draft decodes `draft_len` tokens greedily with its own KV cache, and the target
verifies the chain in one forward. The draft cache is kept equal to the verified sequence: after
verification it is truncated to the last position whose input is still on the accepted path, and
the next step feeds only the tokens it has not seen (the bonus token, and the last draft token
if every draft token was accepted), so no draft position is ever recomputed.

Draft loop per step: one draft forward per draft token, each of one token (two for the first
after a full acceptance) with the LM head on the last position only, greedy argmax, nothing
else. `draft_cost` in the summary compares its time per forward with the target's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.loop import Draft, StepResult, draft_limit
from . import VllmServing
from .draft_lm import DraftLMConfig, causal_batch, draft_trainee, export_hf_draft, load_draft_lm, open_draft

NAME = "draft_model"


# ---- training -----------------------------------------------------------------------------------
TRAIN_SETTINGS = {"draft": DraftLMConfig}


def hidden_taps(config, settings: dict) -> list[int]:
    return []   # the draft trains on token ids only


def setup(target, data, settings: dict, tcfg, device: str):
    pad = 0  # right padding is never visible to real tokens under a causal mask
    return draft_trainee(NAME, target, data, settings, tcfg, device,
                         make_batch=lambda seqs, step: causal_batch(seqs, pad), max_pos=1, method_config={})


def load_module(ckpt_dir: str, target_model):
    return load_draft_lm(ckpt_dir, NAME, target_model.config)[1]


# ---- vLLM ---------------------------------------------------------------------------------------
VLLM = VllmServing(export="draft")


def vllm_config(p: DraftModelConfig, export_dir: str) -> dict:
    # vLLM's drafter stops at num_speculative_tokens; it has no confidence threshold
    return {"method": "draft_model", "model": str(export_dir), "num_speculative_tokens": p.draft_len}


def export_vllm(ckpt_dir: str, target_dir: str, out_dir: str) -> None:
    """vLLM's draft_model method loads the standalone Hugging Face draft as it is."""
    export_hf_draft(ckpt_dir, NAME, target_dir, out_dir)


# ---- inference ----------------------------------------------------------------------------------


@dataclass
class DraftModelConfig:
    checkpoint: str
    draft_len: int = 3
    # stop drafting after a token whose draft probability is below this (0: always draft_len
    # tokens); transformers' assisted generation does the same (assistant_confidence_threshold)
    confidence_threshold: float = 0.0


class DraftModelProposer:
    tap_layers = ()
    drafts_from_prompt = True  # no target state needed: the first step verifies a draft

    def __init__(self, cfg: DraftModelConfig, target):
        self.cfg = cfg
        self.meta, self.draft = open_draft(cfg.checkpoint, NAME, target, cfg.draft_len)
        stop = f", stop below p={cfg.confidence_threshold}" if cfg.confidence_threshold else ""
        self.draft_shape = (f"chain k<={cfg.draft_len}{stop}, "
                            f"draft LM of {self.draft.num_layers} layers")
        self._fed = 0      # length of the sequence (prompt + emitted) when the last draft was made
        self._drafted = 0  # tokens in that draft

    def start(self, prompt_ids, hidden, sampler=None) -> None:
        self.sampler = sampler
        self.draft.prefill([])  # an empty cache: the first propose() feeds the whole prompt

    def propose(self, ids: list[int], max_depth: int | None = None) -> Draft | None:
        d = self.draft
        new = ids[d.cached:]                     # tokens the draft has not seen, the pending one last
        tokens, qs = [], []
        for _ in range(draft_limit(self.cfg.draft_len, max_depth)):
            logits, _ = d.forward(new, logits_to_keep=1)   # only the last position's logits are used
            d.commit(None)
            last = logits[-1]
            if self.sampler is None:
                tokens.append(int(last.argmax()))
                confidence = self.cfg.confidence_threshold and torch.softmax(last.float(), -1)[tokens[-1]]
            else:
                token, q = self.sampler.sample(last)     # draw x ~ q, and tell the verifier q
                tokens.append(int(token))
                qs.append(q)
                confidence = q[tokens[-1]]
            new = tokens[-1:]
            if self.cfg.confidence_threshold and confidence < self.cfg.confidence_threshold:
                break  # the draft is unsure: verify what we have
        # the cache now holds ids + tokens[:-1]
        self._fed, self._drafted = len(ids), len(tokens)
        return Draft.chain(tokens, torch.stack(qs) if qs else None)

    def observe(self, step: StepResult) -> None:
        # draft token i (0-based) was an input at position _fed + i; inputs stay valid while they
        # are on the accepted path: the first min(accepted, draft_len - 1) draft tokens
        keep = self._fed + min(len(step.accepted), self._drafted - 1)
        self.draft.truncate(min(keep, self.draft.cached))


PARAMS = DraftModelConfig
EXAMPLE = {"params": {"draft_len": 3},
           "train": {"train": {"steps": 6, "batch_size": 4, "save_every": 3}, "draft": {"num_layers": 1}}}


def build(params: dict, target) -> DraftModelProposer:
    return DraftModelProposer(DraftModelConfig(**params), target)


def tuning_grid(p: DraftModelConfig) -> dict:
    # each draft token is one drafter forward
    return {"draft_len": [1, 2, 3, 4]}
