"""vLLM's plain greedy decoding as a peer arm of our loop's job (methods/peers.py: vllm_generate),
so that "our baseline against vLLM's" is a paired ratio, timed like every other arm: same prompts,
balanced order, one process.

The engine is vLLM's offline LLM on the job's checkpoint, in the job's dtype, its engine core and
worker in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, executor "uni"): it computes on the
job's own torch threads, as our loop does, and nothing runs while another arm is timed. One
request at a time (max_num_seqs 1), eager mode, prefix caching off (each prompt is decoded once
per arm, but warm-up decodes must not cache a timed prompt's prefill). It stops at the job's EOS
ids, as our loop does.

vLLM's CPU worker replaces torch.set_num_threads with a no-op once it starts in a process; the
job sets its threads before, and start_engine checks they are unchanged after.
"""
from __future__ import annotations

import os
import time

import torch

from ..core.loop import DecodeResult

DEFAULT_KV_CACHE_BYTES = 1 << 30


def start_engine(target_dir: str, dtype: str, context: int, params: dict):
    """vLLM's engine on the target (dtype: a torch dtype name), admitting one request of up to
    `context` tokens; the torch thread count is checked unchanged."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # read when the engine is built
    from vllm import LLM
    threads = torch.get_num_threads()
    llm = LLM(model=str(target_dir), dtype=dtype, enforce_eager=True, distributed_executor_backend="uni",
              max_num_seqs=1, max_model_len=context, enable_prefix_caching=False, seed=0,
              kv_cache_memory_bytes=int(params.get("kv_cache_memory_bytes", DEFAULT_KV_CACHE_BYTES)))
    if torch.get_num_threads() != threads:
        raise RuntimeError(f"vllm_generate: starting vLLM's engine changed torch's threads from {threads} to "
                           f"{torch.get_num_threads()}; the peer would not compute on the job's threads")
    return llm


def vllm_runner(target_dir: str, dtype: str, context: int, params: dict, eos_ids: set[int]):
    """run(prompt_ids, index, n) -> DecodeResult: one greedy request of n new tokens at most,
    stopping at `eos_ids`; the wall time is LLM.generate's, submission to the last token."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = start_engine(target_dir, dtype, context, params)

    def run(prompt_ids: list[int], index: int, n: int) -> DecodeResult:
        sp = SamplingParams(temperature=0.0, max_tokens=n, stop_token_ids=sorted(eos_ids))
        t0 = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=list(prompt_ids))], sp, use_tqdm=False)
        wall = time.perf_counter() - t0
        new = list(out[0].outputs[0].token_ids)
        return DecodeResult(new, wall, ttft_s=None, draft_s=None, fused_first_step=False,
                            drafted=None, accepted=None, depth=None)
    return run
