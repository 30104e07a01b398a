"""Benchmark one method (or the baseline, or a Hugging Face peer) with our PyTorch loop.

Model loading is outside the timings; the first `warmup` prompts are decoded once untimed.
Prompts that do not fit the context (prompt + max_new_tokens + draft margin) are skipped and
listed in the summary. Records and summary follow core.metrics.
"""
from __future__ import annotations

import torch
from tqdm import tqdm

from ..core.loop import decode
from ..core.metrics import attach_baseline, make_record, summarize
from ..core.target import TargetModel
from ..data.records import read_jsonl, read_prompts, write_json, write_jsonl
from ..methods import build_proposer
from ..models import eos_token_ids, load_causal_lm, load_tokenizer
from .hf_generate import PEERS, hf_decode, peer_kwargs

DRAFT_MARGIN = 64  # room left in the context for draft nodes


def bench_torch(*, target_dir: str, prompts_path: str, dataset: str, method: str, variant: str | None,
                params: dict, out_records: str, out_summary: str, baseline_path: str | None = None,
                limit: int | None = None, max_new_tokens: int = 64, warmup: int = 1,
                dtype: str = "float32", device: str = "cpu", threads: int = 0) -> dict:
    if threads:
        torch.set_num_threads(threads)
    prompts = read_prompts(prompts_path, limit)
    baseline = read_jsonl(baseline_path, ("id", "output_ids", "wall_s")) if baseline_path else None
    model = load_causal_lm(target_dir, dtype, device)
    tokenizer = load_tokenizer(target_dir)
    eos = eos_token_ids(model, tokenizer)
    label = method if variant is None else f"{method}/{variant}"

    context = getattr(model.config, "max_position_embeddings", None) or 10**9
    fits = [p for p in prompts if len(p["prompt_ids"]) + max_new_tokens + DRAFT_MARGIN <= context]
    skipped = [{"id": p["id"], "prompt_tokens": len(p["prompt_ids"]), "context": context}
               for p in prompts if p not in fits]
    if not fits:
        raise ValueError(f"{prompts_path}: no prompt fits the context of {context} tokens")

    if method in PEERS:
        kwargs = peer_kwargs(method, params)
        run = lambda ids: hf_decode(model, ids, max_new_tokens, eos, kwargs)  # noqa: E731
        proposer = None
    else:
        target = TargetModel(model)
        proposer = None if method == "baseline" else build_proposer(method, params, target)
        run = lambda ids: decode(target, ids, max_new_tokens, eos, proposer)  # noqa: E731

    for p in fits[:warmup]:
        run(p["prompt_ids"])  # warm-up: allocator, kernels, caches; not recorded

    records = []
    bar = tqdm(fits, desc=f"{label} on {dataset}", unit="prompt")
    new_total = wall_total = 0.0
    for p in bar:
        r = run(p["prompt_ids"])
        new_total += len(r.output_ids)
        wall_total += r.wall_s
        bar.set_postfix(tok_s=f"{new_total / wall_total:.1f}")
        records.append(make_record(
            id=p["id"], dataset=dataset, method=label, prompt_tokens=len(p["prompt_ids"]),
            new_tokens=len(r.output_ids), wall_s=r.wall_s, ttft_s=r.ttft_s, draft_s=r.draft_s,
            steps=len(r.drafted) if r.drafted is not None else None,
            drafted=r.drafted, accepted=r.accepted, output_ids=r.output_ids,
            matches_baseline=None, first_divergence=None))
    if proposer is not None and hasattr(proposer, "close"):
        proposer.close()

    attach_baseline(records, baseline)
    settings = {"backend": "torch", "method": method, "variant": variant, "params": params,
                "dtype": dtype, "device": device, "max_new_tokens": max_new_tokens,
                "warmup_prompts": warmup, "prompts_file": str(prompts_path), "target": str(target_dir),
                "limit": limit}
    summary = summarize(records, baseline, settings, skipped)
    if method == "hf_prompt_lookup":
        summary["draft_shape"] = f"chain k={params.get('prompt_lookup_num_tokens', 10)}"
    else:
        summary["draft_shape"] = getattr(proposer, "draft_shape", None)
    write_jsonl(out_records, records)
    write_json(out_summary, summary)
    return summary
