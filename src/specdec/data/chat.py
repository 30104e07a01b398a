"""Chat distillation set: first human turns + the target's greedy completions (token ids).

Splits, as files: train; eval_overlap = the first N train records (the reference system's
train-overlap slice, a best-case probe); eval_heldout = records disjoint from train.
"""
from __future__ import annotations

import random

import torch
from tqdm import tqdm

from .sharegpt import normalise, usable
from .wiki import chat_ids


def select_prompts(turns, tokenizer, n: int, min_chars: int, max_chars: int,
                   max_prompt_tokens: int, seed: int) -> list[dict]:
    """Filter, de-duplicate, shuffle (seeded) and template the first `n` usable prompts."""
    seen, pool = set(), []
    for source_id, text in turns:
        text = normalise(text)
        key = text.lower()
        if key in seen or not usable(text, min_chars, max_chars):
            continue
        seen.add(key)
        pool.append((source_id, text))
    random.Random(seed).shuffle(pool)
    out = []
    for source_id, text in pool:
        ids = chat_ids(tokenizer, text)
        if len(ids) > max_prompt_tokens:
            continue
        out.append({"source_id": source_id, "prompt": text, "prompt_ids": ids})
        if len(out) == n:
            return out
    raise ValueError(f"chat set: only {len(out)} usable prompts, {n} requested")


@torch.inference_mode()
def greedy_completions(model, tokenizer, prompts: list[list[int]], max_new_tokens: int,
                       batch_size: int, eos_ids: set[int]) -> list[list[int]]:
    """Batched greedy generation (left padding); each completion is cut after its first EOS."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
    device = next(model.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths together
    results: list[list[int]] = [[] for _ in prompts]
    for b in tqdm(range(0, len(order), batch_size), desc="greedy completions", unit="batch"):
        idx = order[b: b + batch_size]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]):] = 1
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                             max_new_tokens=max_new_tokens, eos_token_id=sorted(eos_ids), pad_token_id=pad)
        for row, i in enumerate(idx):
            gen = out[row, width:].tolist()
            cut = next((j + 1 for j, t in enumerate(gen) if t in eos_ids), len(gen))
            results[i] = gen[:cut]
    return results


def build_chat_splits(turns, model, tokenizer, eos_ids: set[int], *, prefix: str, train_prompts: int,
                      heldout_prompts: int, eval_overlap_prompts: int, completion_tokens: int,
                      min_chars: int, max_chars: int, max_prompt_tokens: int, batch_size: int,
                      seed: int) -> dict[str, list[dict]]:
    if eval_overlap_prompts > train_prompts:
        raise ValueError("chat set: eval_overlap_prompts must not exceed train_prompts")
    chosen = select_prompts(turns, tokenizer, train_prompts + heldout_prompts, min_chars, max_chars,
                            max_prompt_tokens, seed)
    completions = greedy_completions(model, tokenizer, [r["prompt_ids"] for r in chosen],
                                     completion_tokens, batch_size, eos_ids)
    records = []
    for k, (r, comp) in enumerate(zip(chosen, completions)):
        split = "train" if k < train_prompts else "heldout"
        records.append({"id": f"{prefix}-{split}-{k:05d}", **r, "completion_ids": comp,
                        "completion_text": tokenizer.decode(comp, skip_special_tokens=True)})
    train = records[:train_prompts]
    return {"train": train, "eval_overlap": train[:eval_overlap_prompts],
            "eval_heldout": records[train_prompts:]}
