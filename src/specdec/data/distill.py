"""Distillation labels at scale: the routes `specdec distill-routes` times on this host
(data/distill_routes.py).

- generate (transformers): the target's greedy completion of each prompt through
  `model.generate`, batched with left padding (chat.greedy_completions; the chat set's route for
  its evaluation records, and for every training record with `train_completions: greedy`).
- generate (vLLM): the same greedy completions through a vLLM engine that runs many sequences at
  once (`max_num_seqs`); the labels are the completion tokens.
- prefill: no autoregressive decoding. The target runs once over prompt + a reference reply
  (ShareGPT's first assistant turn); its argmax at every reply position is that position's label
  (self-distillation on fixed text). One forward per batch; the chat set's route for its
  training records (`train_completions: reference`), where the same pass (train/hidden.py) also
  gives the hidden states the learned drafters train on.
Each route reports the label tokens it produced per second of wall time, prompt processing
included.
"""
from __future__ import annotations

import time

import torch
from tqdm import tqdm


def first_exchanges(text: str):
    """(id, first human message, the assistant's reply to it) from the ShareGPT file, for
    conversations that open with a human turn answered by the assistant ("gpt")."""
    from .sharegpt import first_human_turns
    return ((i, human, reply) for i, human, reply in first_human_turns(text) if reply is not None)


def _rate(labels: int, seconds: float, **extra) -> dict:
    return {"label_tokens": labels, "seconds": seconds, "label_tokens_per_s": labels / seconds, **extra}


def generate_transformers(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, batch_size: int,
                          eos_ids: set[int]) -> tuple[list[list[int]], dict]:
    from .chat import greedy_completions
    t = time.perf_counter()
    out = greedy_completions(model, tokenizer, prompts, max_new_tokens, batch_size, eos_ids)
    return out, _rate(sum(map(len, out)), time.perf_counter() - t, batch_size=batch_size)


def generate_vllm(target_dir: str, prompts: list[list[int]], max_new_tokens: int, dtype: str,
                  max_num_seqs: int, kv_cache_memory_bytes: int, max_model_len: int,
                  eos_ids: set[int] | None = None) -> tuple[list[list[int]], dict]:
    """Greedy completions through one in-process vLLM engine; the engine's start-up is not timed.
    `eos_ids`: each completion ends after the first of them (inclusive), as greedy_completions'."""
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=target_dir, dtype=dtype, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
              kv_cache_memory_bytes=kv_cache_memory_bytes, enforce_eager=True, distributed_executor_backend="uni")
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=sorted(eos_ids or ()))
    t = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=True)
    seconds = time.perf_counter() - t
    out = [list(o.outputs[0].token_ids) for o in outs]
    if eos_ids:
        out = [c[:next((j + 1 for j, t in enumerate(c) if t in eos_ids), len(c))] for c in out]
    return out, _rate(sum(map(len, out)), seconds, max_num_seqs=max_num_seqs)


@torch.inference_mode()
def prefill_labels(model, seqs: list[list[int]], starts: list[int], batch_size: int) -> tuple[list[list[int]], dict]:
    """The target's argmax at every position from starts[i] - 1 on: label j of sequence i is the
    target's next token after seqs[i][:starts[i] + j] (the labels of the reply's tokens)."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))   # similar lengths share a batch
    labels: list[list[int]] = [[] for _ in seqs]
    device = next(model.parameters()).device
    t = time.perf_counter()
    for b in tqdm(range(0, len(order), batch_size), desc="prefill labels", unit="batch"):
        idx = order[b: b + batch_size]
        width = max(len(seqs[i]) for i in idx)
        # right padding: under the causal mask real tokens never see the pad tokens after them
        ids = torch.zeros(len(idx), width, dtype=torch.long)
        for row, i in enumerate(idx):
            ids[row, :len(seqs[i])] = torch.tensor(seqs[i])
        logits = model(input_ids=ids.to(device), use_cache=False).logits          # (B, width, V)
        for row, i in enumerate(idx):
            labels[i] = logits[row, starts[i] - 1: len(seqs[i])].argmax(-1).tolist()
    seconds = time.perf_counter() - t
    return labels, _rate(sum(map(len, labels)), seconds, batch_size=batch_size,
                         processed_tokens=sum(map(len, seqs)))
