"""Benchmark one method (or the baseline, or a Hugging Face peer) with our PyTorch loop.

Model loading is outside the timings; the first `warmup` prompts are decoded once untimed, for
WARMUP_TOKENS new tokens (prefill and steady-state steps: allocator, kernels, caches).
Prompts that do not fit the context (prompt + max_new_tokens + draft margin) are skipped and
listed in the summary. Records and summary follow core.metrics.
"""
from __future__ import annotations

import statistics

import torch
from tqdm import tqdm

from ..core.loop import decode
from ..core.metrics import attach_baseline, make_record, summarize
from ..core.target import TargetModel
from ..data.records import read_jsonl, read_prompts, write_json, write_jsonl
from ..methods import build_proposer
from ..models import eos_token_ids, load_causal_lm, load_tokenizer, set_threads
from .hf_generate import PEERS, hf_decode, peer_kwargs

DRAFT_MARGIN = 64  # room left in the context for draft nodes
WARMUP_TOKENS = 16  # a warm-up decode runs prefill and steady-state steps; more tokens add nothing


def _runner(model, method: str, params: dict, max_new_tokens: int, eos: set[int], target=None):
    """(run(prompt_ids, n=max_new_tokens) -> DecodeResult, proposer or None) for our loop or a
    Hugging Face peer."""
    if method in PEERS:
        kwargs = peer_kwargs(method, params, model)
        return (lambda ids, n=max_new_tokens: hf_decode(model, ids, n, eos, kwargs)), None
    target = target or TargetModel(model)
    proposer = None if method == "baseline" else build_proposer(method, params, target)
    return (lambda ids, n=max_new_tokens: decode(target, ids, n, eos, proposer)), proposer


def _record(p: dict, r, dataset: str, label: str) -> dict:
    return make_record(
        id=p["id"], dataset=dataset, method=label, prompt_tokens=len(p["prompt_ids"]),
        new_tokens=len(r.output_ids), wall_s=r.wall_s, ttft_s=r.ttft_s,
        fused_first_step=r.fused_first_step, draft_s=r.draft_s,
        steps=len(r.drafted) if r.drafted is not None else None,
        drafted=r.drafted, accepted=r.accepted, output_ids=r.output_ids,
        draft_depth=r.depth if r.drafted is not None else None,
        matches_baseline=None, first_divergence=None)


def bench_torch(*, target_dir: str, prompts_path: str, dataset: str, method: str, variant: str | None,
                params: dict, out_records: str, out_summary: str, baseline_path: str | None = None,
                limit: int | None = None, max_new_tokens: int = 64, warmup: int = 1,
                dtype: str = "float32", device: str = "cpu", threads: int = 0,
                counterpart: str | None = None, counterpart_params: dict | None = None) -> dict:
    """Benchmark `method` (records + summary). With `counterpart` ("baseline" or one of our
    methods), that arm is timed too, alternating with `method` prompt by prompt in this process,
    and the summary gets the same-run ratio (`same_run`): the fair way to compare two arms on a
    noisy shared machine."""
    set_threads(threads)
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

    run, proposer = _runner(model, method, params, max_new_tokens, eos)
    arms = [run]
    if counterpart is not None:
        other, other_proposer = _runner(model, counterpart, counterpart_params or {}, max_new_tokens, eos)
        arms.append(other)
    warmup_tokens = min(max_new_tokens, WARMUP_TOKENS)
    for p in fits[:warmup]:
        for arm in arms:
            arm(p["prompt_ids"], warmup_tokens)  # warm-up: allocator, kernels, caches; not recorded

    records, other_records = [], []
    bar = tqdm(fits, desc=f"{label} on {dataset}", unit="prompt")
    new_total = wall_total = 0.0
    for i, p in enumerate(bar):
        # alternate which arm goes first, so neither always runs on a warmer machine
        order = list(range(len(arms)))
        for a in order if i % 2 == 0 else order[::-1]:
            r = arms[a](p["prompt_ids"])
            (records if a == 0 else other_records).append(_record(p, r, dataset, label if a == 0 else counterpart))
        new_total += records[-1]["new_tokens"]
        wall_total += records[-1]["wall_s"]
        bar.set_postfix(tok_s=f"{new_total / wall_total:.1f}")
    for prop in (proposer, other_proposer if counterpart is not None else None):
        if prop is not None and hasattr(prop, "close"):
            prop.close()

    attach_baseline(records, baseline)
    settings = {"backend": "torch", "method": method, "variant": variant, "params": params,
                "dtype": dtype, "device": device, "max_new_tokens": max_new_tokens,
                "warmup_prompts": warmup, "warmup_tokens": warmup_tokens,
                "prompts_file": str(prompts_path), "target": str(target_dir),
                "limit": limit, "counterpart": counterpart, "counterpart_params": counterpart_params}
    summary = summarize(records, baseline, settings, skipped)
    if method == "hf_prompt_lookup":
        summary["draft_shape"] = f"chain k={params.get('prompt_lookup_num_tokens', 10)}"
    else:
        summary["draft_shape"] = getattr(proposer, "draft_shape", None)
    if counterpart is not None:
        summary["same_run"] = same_run_comparison(records, other_records, counterpart)
    write_jsonl(out_records, records)
    write_json(out_summary, summary)
    return summary


def same_run_comparison(records: list[dict], other: list[dict], counterpart: str) -> dict:
    """Counterpart arm vs this arm, timed alternately in one process on the same prompts."""
    wall, other_wall = sum(r["wall_s"] for r in records), sum(r["wall_s"] for r in other)
    new, other_new = sum(r["new_tokens"] for r in records), sum(r["new_tokens"] for r in other)
    return {
        "counterpart": counterpart,
        "wall_s": wall,
        "counterpart_wall_s": other_wall,
        "throughput_tok_s": new / wall,
        "counterpart_throughput_tok_s": other_new / other_wall,
        # > 1: the counterpart (ours) is faster than this arm (the peer)
        "counterpart_speedup": wall / other_wall,
        "counterpart_median_prompt_speedup": statistics.median(
            r["wall_s"] / o["wall_s"] for r, o in zip(records, other)),
        "same_outputs": sum(r["output_ids"] == o["output_ids"] for r, o in zip(records, other)),
    }
