"""Hugging Face `generate` peers, measured with the same prompts, records and summary schema:
greedy `generate` (the baseline's peer), prompt lookup (`prompt_lookup_num_tokens`, the
n-gram method's peer) and assisted generation (`assistant_model`, the draft-model method's peer,
with the same draft checkpoint)."""
from __future__ import annotations

import time

import torch
from transformers.generation.streamers import BaseStreamer

from ..core.loop import DecodeResult
from ..methods.peers import PEERS


class _FirstTokenClock(BaseStreamer):
    """generate() calls put() with the prompt first, then with each new token."""

    def __init__(self):
        self.calls, self.first = 0, None

    def put(self, value):
        self.calls += 1
        if self.calls == 2 and self.first is None:
            self.first = time.perf_counter()

    def end(self):
        pass


def peer_kwargs(method: str, params: dict, model=None) -> dict:
    """generate()'s keywords for a peer's variant (methods/peers.py declares what it takes)."""
    if method not in PEERS:
        raise ValueError(f"unknown Hugging Face peer {method!r}")
    peer = PEERS[method]
    peer.check(method, params)
    kwargs = {k: v for k, v in params.items() if k != "checkpoint"}
    if peer.owner is None:
        return kwargs
    from ..methods.draft_lm import load_draft_lm
    device = next(model.parameters()).device
    _, draft = load_draft_lm(params["checkpoint"], peer.owner, model.config, model.dtype, device)
    gen = draft.generation_config   # generate() reads the assistant's settings from here
    for k, v in kwargs.items():
        setattr(gen, k, v)
    return {"assistant_model": draft}


@torch.inference_mode()
def hf_decode(model, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int], kwargs: dict) -> DecodeResult:
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids], device=device)
    clock = _FirstTokenClock()
    t0 = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=max_new_tokens, eos_token_id=sorted(eos_ids),
                         pad_token_id=min(eos_ids), streamer=clock, **kwargs)
    wall = time.perf_counter() - t0
    new = out[0, len(prompt_ids):].tolist()
    # transformers' assisted decoding (assistant model or prompt lookup) runs its first target
    # forward on the prompt plus the first candidates, as our loop does for drafts_from_prompt
    fused = "assistant_model" in kwargs or "prompt_lookup_num_tokens" in kwargs
    return DecodeResult(new, wall, ttft_s=(clock.first - t0) if clock.first else None, draft_s=None,
                        fused_first_step=fused, drafted=None, accepted=None, depth=None)
