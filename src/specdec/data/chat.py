"""Chat distillation set: first human turns, each with a completion whose positions the drafters
learn to predict.

Splits, as files: eval_heldout = records no drafter trains on (the headline set; first in the
seeded shuffle, so its prompts do not depend on the training set's size); train; eval_overlap =
the first N train records (the reference system's train-overlap slice, a best-case probe).

Completions: the held-out and train-overlap records carry the target's greedy completions. The
other training records carry either those too (`train_completions: greedy`, the reference
system's protocol: one autoregressive decode per prompt) or the source's reference reply
(`reference`: the first assistant turn, clipped to `completion_tokens`, EOS after a reply that
fits), whose labels are the target's own argmax at each reply position, from the one prefill that
also computes the hidden states (train/hidden.py). Prefill costs a fraction of decoding per token.
"""
from __future__ import annotations

import random

import torch
from tqdm import tqdm

from .sharegpt import normalise, usable
from .wiki import chat_ids

COMPLETIONS = ("greedy", "reference")


def select_prompts(turns, tokenizer, n: int, min_chars: int, max_chars: int,
                   max_prompt_tokens: int, seed: int, require_reply: bool = False) -> list[dict]:
    """Filter, de-duplicate, shuffle (seeded) and template the first `n` usable prompts; `turns`
    are (source id, text, reply or None)."""
    seen, pool = set(), []
    for source_id, text, reply in turns:
        text = normalise(text)
        key = text.lower()
        if key in seen or not usable(text, min_chars, max_chars) or (require_reply and not (reply or "").strip()):
            continue
        seen.add(key)
        pool.append((source_id, text, reply))
    random.Random(seed).shuffle(pool)
    out = []
    for source_id, text, reply in pool:
        ids = chat_ids(tokenizer, text)
        if len(ids) > max_prompt_tokens:
            continue
        out.append({"source_id": source_id, "prompt": text, "prompt_ids": ids, "reply": reply})
        if len(out) == n:
            return out
    raise ValueError(f"chat set: only {len(out)} usable prompts{' with a reply' if require_reply else ''}, "
                     f"{n} requested")


def reference_completion(tokenizer, reply: str, max_tokens: int) -> list[int]:
    """The reply's tokens after the chat template's assistant header: its first `max_tokens`, or
    all of them and the end-of-turn token when it fits."""
    ids = tokenizer(reply.strip(), add_special_tokens=False)["input_ids"]
    if len(ids) < max_tokens:
        if tokenizer.eos_token_id is None:
            raise ValueError("chat set: the tokenizer has no eos_token_id to end a reference reply")
        return ids + [tokenizer.eos_token_id]
    return ids[:max_tokens]


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
                      seed: int, train_completions: str = "greedy",
                      complete=None) -> dict[str, list[dict]]:
    """`complete(prompts) -> completions`: the greedy engine (None: transformers' generate on
    `model`, greedy_completions); each completion ends after its first EOS or at completion_tokens."""
    if eval_overlap_prompts > train_prompts:
        raise ValueError("chat set: eval_overlap_prompts must not exceed train_prompts")
    if train_completions not in COMPLETIONS:
        raise ValueError(f"chat set: train_completions must be one of {COMPLETIONS}, not {train_completions!r}")
    reference = train_completions == "reference"
    chosen = select_prompts(turns, tokenizer, heldout_prompts + train_prompts, min_chars, max_chars,
                            max_prompt_tokens, seed, require_reply=reference)
    heldout, train = chosen[:heldout_prompts], chosen[heldout_prompts:]
    greedy = heldout + (train[:eval_overlap_prompts] if reference else train)
    prompts = [r["prompt_ids"] for r in greedy]
    completions = (complete(prompts) if complete is not None
                   else greedy_completions(model, tokenizer, prompts, completion_tokens, batch_size, eos_ids))
    for r, comp in zip(greedy, completions):
        r["completion_ids"], r["completion_source"] = comp, "greedy"
    for r in train[eval_overlap_prompts:] if reference else []:
        r["completion_ids"] = reference_completion(tokenizer, r["reply"], completion_tokens)
        r["completion_source"] = "reference"

    def finish(records, split):
        return [{"id": f"{prefix}-{split}-{k:05d}", **{f: v for f, v in r.items() if f != "reply"},
                 "completion_text": tokenizer.decode(r["completion_ids"], skip_special_tokens=True)}
                for k, r in enumerate(records)]

    train = finish(train, "train")
    return {"train": train, "eval_overlap": train[:eval_overlap_prompts],
            "eval_heldout": finish(heldout, "heldout")}
