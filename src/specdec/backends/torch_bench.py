"""Benchmark one method (or a Hugging Face peer) against the greedy baseline with our PyTorch
loop, both arms timed in one process.

Model loading is outside the timings; the first `warmup` prompts are decoded once untimed, for
WARMUP_TOKENS new tokens (prefill and steady-state steps: allocator, kernels, caches).
Prompts that do not fit the context (prompt + max_new_tokens + draft margin) are skipped and
listed in the summary. Records and summary follow core.metrics.
Sampled rows (T > 0): prompt i decodes with seed + i in both arms, and both arms decode exactly
max_new_tokens (EOS ignored), since their sampled texts differ: the wall ratio stays a ratio of
equal work.
"""
from __future__ import annotations

from tqdm import tqdm

from ..core.loop import decode
from ..core.metrics import attach_baseline, make_record, summarize
from ..core.sampling import Sampling
from ..core.stats import paired_bootstrap
from ..core.target import TargetModel
from ..data.records import read_prompts, write_json, write_jsonl
from ..host import dtype_record
from ..methods import build_proposer
from ..models import eos_token_ids, load_causal_lm, load_tokenizer, set_threads
from .hf_generate import PEERS, hf_decode, peer_kwargs

DRAFT_MARGIN = 64  # room left in the context for draft nodes
WARMUP_TOKENS = 16  # a warm-up decode runs prefill and steady-state steps; more tokens add nothing


def _runner(model, method: str, params: dict, max_new_tokens: int, eos: set[int], sampling: Sampling):
    """(run(prompt_ids, index, n=max_new_tokens) -> DecodeResult, proposer or None) for our loop
    or a Hugging Face peer; prompt `index` samples with its own seed."""
    if method in PEERS:
        if not sampling.greedy:
            raise ValueError(f"{method}: the Hugging Face peers run greedy rows only")
        kwargs = peer_kwargs(method, params, model)
        return (lambda ids, index, n=max_new_tokens: hf_decode(model, ids, n, eos, kwargs)), None
    target = TargetModel(model)
    proposer = None if method == "baseline" else build_proposer(method, params, target)
    return (lambda ids, index, n=max_new_tokens:
            decode(target, ids, n, eos, proposer, sampling=sampling.for_prompt(index))), proposer


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
                params: dict, out_records: str, out_summary: str, limit: int | None = None,
                max_new_tokens: int = 64, warmup: int = 1, dtype: str = "auto", device: str = "cpu",
                threads: int = 0, resamples: int = 10000, counterpart: str | None = None,
                counterpart_params: dict | None = None, sampling: dict | None = None) -> dict:
    """Benchmark `method` against the greedy baseline, both timed in this process on the same
    prompts, alternating prompt by prompt with the order flipped every prompt (so neither arm
    always runs on a warmer machine). The baseline arm gives the paired speedup and its interval,
    and the reference outputs for the token-by-token check. A Hugging Face peer also times
    `counterpart`, the arm of ours it is compared with (`same_run`). `dtype` "auto" is the host's
    speed dtype (specdec.host). `sampling` (core.sampling.Sampling fields): greedy when absent or
    at temperature 0. Records of every arm go to `out_records`."""
    if method == "baseline":
        raise ValueError("the baseline is timed inside every method's job; benchmark a method")
    set_threads(threads)
    sampled = Sampling(**(sampling or {}))
    dt = dtype_record(dtype, device)
    prompts = read_prompts(prompts_path, limit)
    model = load_causal_lm(target_dir, dt["dtype"], device)
    tokenizer = load_tokenizer(target_dir)
    eos = eos_token_ids(model, tokenizer) if sampled.greedy else set()   # sampled rows: equal lengths
    label = method if variant is None else f"{method}/{variant}"

    context = getattr(model.config, "max_position_embeddings", None) or 10**9
    fits = [p for p in prompts if len(p["prompt_ids"]) + max_new_tokens + DRAFT_MARGIN <= context]
    skipped = [{"id": p["id"], "prompt_tokens": len(p["prompt_ids"]), "context": context}
               for p in prompts if p not in fits]
    if not fits:
        raise ValueError(f"{prompts_path}: no prompt fits the context of {context} tokens")

    arms = {label: _runner(model, method, params, max_new_tokens, eos, sampled),
            "baseline": _runner(model, "baseline", {}, max_new_tokens, eos, sampled)}
    if counterpart is not None:
        arms[counterpart] = _runner(model, counterpart, counterpart_params or {}, max_new_tokens, eos, sampled)
    warmup_tokens = min(max_new_tokens, WARMUP_TOKENS)
    for i, p in enumerate(fits[:warmup]):
        for run, _ in arms.values():
            run(p["prompt_ids"], i, warmup_tokens)  # warm-up: allocator, kernels, caches; not recorded

    records = {name: [] for name in arms}
    bar = tqdm(fits, desc=f"{label} vs baseline on {dataset}", unit="prompt")
    for i, p in enumerate(bar):
        order = list(arms) if i % 2 == 0 else list(arms)[::-1]
        for name in order:
            r = arms[name][0](p["prompt_ids"], i)
            records[name].append(_record(p, r, dataset, name))
        wall = {n: sum(r["wall_s"] for r in rs) for n, rs in records.items()}
        bar.set_postfix(speedup=f"{wall['baseline'] / wall[label]:.2f}x")
    for _, proposer in arms.values():
        if proposer is not None and hasattr(proposer, "close"):
            proposer.close()

    base = records["baseline"]
    attach_baseline(base, base)
    for name in arms:
        if name != "baseline":
            attach_baseline(records[name], base)
    settings = {"backend": "torch", "method": method, "variant": variant, "params": params,
                **dt, "device": device, "max_new_tokens": max_new_tokens,
                "warmup_prompts": warmup, "warmup_tokens": warmup_tokens,
                "prompts_file": str(prompts_path), "target": str(target_dir),
                "limit": limit, "counterpart": counterpart, "counterpart_params": counterpart_params,
                "sampling": sampled.to_dict(), "ignore_eos": not sampled.greedy}
    summary = summarize(records[label], base, settings, skipped, resamples)
    if method == "hf_prompt_lookup":
        summary["draft_shape"] = f"chain k={params.get('prompt_lookup_num_tokens', 10)}"
    else:
        summary["draft_shape"] = getattr(arms[label][1], "draft_shape", None)
    if counterpart is not None:
        summary["same_run"] = same_run_comparison(records[label], records[counterpart], counterpart, resamples)
    write_jsonl(out_records, [r for rs in records.values() for r in rs])
    write_json(out_summary, summary)
    return summary


def same_run_comparison(records: list[dict], other: list[dict], counterpart: str, resamples: int) -> dict:
    """Our arm (`counterpart`) vs this arm (a Hugging Face peer), timed alternately in one process
    on the same prompts: > 1 means ours is faster."""
    boot = paired_bootstrap([r["wall_s"] for r in records], [o["wall_s"] for o in other], resamples)
    return {
        "counterpart": counterpart,
        "wall_s": sum(r["wall_s"] for r in records),
        "counterpart_wall_s": sum(o["wall_s"] for o in other),
        "counterpart_speedup": boot["speedup"],
        "counterpart_speedup_ci": boot["ci"],
        "counterpart_speedup_ci_method": boot["ci_method"],
        "same_outputs": sum(r["output_ids"] == o["output_ids"] for r, o in zip(records, other)),
    }
