"""Benchmark the methods of one evaluation set against one greedy baseline with our PyTorch loop,
every arm timed in one process.

One job per (data set, dtype): the target is loaded once, every method's proposer is built on it,
and each prompt is decoded by every arm in turn, the baseline included. The arm order is balanced
over the prompts (core.stats.balanced, a Williams design): each arm runs equally often in each
position and right after each other arm equally often, so no arm always runs first, on a colder
machine, or after the same neighbour. Each method's
speedup is the shared baseline arm's wall time over its own, on the same prompts, with a paired
bootstrap interval over prompts; the baseline arm is also the reference for the token-by-token
check.

Model loading is outside the timings; the first `warmup` prompts are decoded once untimed by every
arm, for WARMUP_TOKENS new tokens (prefill and steady-state steps: allocator, kernels, caches).
Prompts that do not fit the context (prompt + max_new_tokens + draft margin) are skipped and
listed in every row. Records and rows follow core.metrics.
Sampled sets (T > 0): prompt i decodes with seed + i in every arm, and every arm decodes exactly
max_new_tokens (EOS ignored), since their sampled texts differ: the wall ratio stays a ratio of
equal work.
The job also times the host's verification steps between its arms (`STEP_COSTS`, a pseudo-arm in
the balanced order): once per prompt, every cell of the cost curve (backends/cost_curve.py: chains
and trees of 1 to 16 nodes) at that prompt's average decode position, on a target of its own. Their
medians are the job's own step costs (`step_costs` of the summary and of every row): what a step of
n nodes costs in plain steps under the very conditions the arms ran in, against which the report
checks every row's speedup (report/costcheck.py); a cost curve from another job on a shared
machine can meet other conditions.
`aa_control` times a second baseline arm like a method: its row (`baseline/aa`) is the job's own
check that two identical arms measure 1.0x (the null drafter, methods/null_drafter.py, is the other
control: verification that gains nothing). `tuning` (backends/tuning.py: tuned_arms) attaches to
each tuned arm's row, and to its fixed variant's, the choice that made it.
"""
from __future__ import annotations

import os

import torch
from tqdm import tqdm

from ..core.loop import decode
from ..core.metrics import attach_baseline, make_record, summarize
from ..core.sampling import Sampling
from ..core.stats import AA_CONTROL, BASELINE, arm_label, balanced, paired_bootstrap
from ..core.target import TargetModel, linear_route
from ..data.records import read_prompts, write_json, write_jsonl
from ..host import dtype_record, set_threads
from ..methods import PEERS, build_proposer
from ..models import eos_token_ids, load_causal_lm, load_tokenizer
from .cost_curve import context_ids, curve_points, time_cells
from .hf_generate import hf_decode, peer_kwargs

DRAFT_MARGIN = 64  # room left in the context for draft nodes
STEP_COSTS = "step costs"   # the pseudo-arm that times the host's verification steps (module doc)
WARMUP_TOKENS = 16  # a warm-up decode runs prefill and steady-state steps; more tokens add nothing


def check_arms(arms: list[dict]) -> None:
    """Arms are {"method", "variant", "params", "compare_with"}: distinct labels, no baseline (every
    job times its own), and a peer's compare_with names another arm of the same job."""
    if not arms:
        raise ValueError("no arms to benchmark: name at least one method")
    labels = [arm_label(a) for a in arms]
    for arm, label in zip(arms, labels):
        unknown = set(arm) - {"method", "variant", "params", "compare_with"}
        if unknown:
            raise ValueError(f"arm {label}: unknown field(s) {sorted(unknown)}")
        if arm["method"] == BASELINE:
            raise ValueError("the baseline is timed inside every job; benchmark a method")
        if labels.count(label) > 1:
            raise ValueError(f"arm {label} is listed twice")
        other = arm.get("compare_with")
        if other is not None and other not in labels:
            raise ValueError(f"arm {label}: compare_with {other!r} is not an arm of this job ({', '.join(labels)})")


def _runner(model, method: str, params: dict, max_new_tokens: int, eos: set[int], sampling: Sampling,
            target_dir: str, context: int):
    """(run(prompt_ids, index, n=max_new_tokens) -> DecodeResult, proposer or None) for our loop
    or a peer (methods/peers.py: its engine; a llama.cpp peer's second element is its server);
    prompt `index` samples with its own seed. The job calls close() on a second element that has one."""
    if method in PEERS:
        if not sampling.greedy:
            raise ValueError(f"{method}: the peers run greedy rows only")
        if PEERS[method].engine == "llamacpp":
            from .llamacpp_peer import llamacpp_runner
            PEERS[method].check(method, params)
            options = {k: v for k, v in params.items() if k != "build"}
            run, server = llamacpp_runner(params["build"], target_dir, model.dtype, torch.get_num_threads(),
                                          context, options)
            return (lambda ids, index, n=max_new_tokens: run(ids, index, n)), server
        if PEERS[method].engine == "vllm":
            from .vllm_peer import vllm_runner
            PEERS[method].check(method, params)
            dtype = str(model.dtype).removeprefix("torch.")
            run = vllm_runner(target_dir, dtype, context, params, eos)
            return (lambda ids, index, n=max_new_tokens: run(ids, index, n)), None
        kwargs = peer_kwargs(method, params, model)
        return (lambda ids, index, n=max_new_tokens: hf_decode(model, ids, n, eos, kwargs)), None
    target = TargetModel(model)
    proposer = None if method == BASELINE else build_proposer(method, params, target)
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


def bench_torch(*, target_dir: str, prompts_path: str, dataset: str, arms: list[dict], out_records: str,
                out_summary: str, limit: int | None = None, max_new_tokens: int = 64, warmup: int = 1,
                dtype: str = "auto", device: str = "cpu", threads: int = 0, resamples: int = 10000,
                sampling: dict | None = None, require_dtype: str | None = None, aa_control: bool = False,
                skip: int = 0, tuning: dict | None = None) -> dict:
    """Benchmark every arm ({"method", "variant", "params", "compare_with"}) against one greedy
    baseline arm, all timed in this process on the same prompts, in a rotating order. Returns and
    writes {"dataset", "rows": [one summary per arm]}. A peer's row (methods/peers.py) may also
    compare it with the arm of ours named by its compare_with (`same_run`). `dtype` "auto" is the host's
    speed dtype (specdec.host). `sampling` (core.sampling.Sampling fields): greedy when absent or
    at temperature 0. Records of every arm go to `out_records`. `require_dtype`: stop unless
    `dtype` resolves to it here (a job planned to run that dtype's arms, the lossless checks, in
    its auto job). `aa_control`: also time a second baseline arm (AA_CONTROL), with a row of its own.
    `skip`: leave out the prompts file's first records (the tuning split: what the benchmarks never
    read). `tuning`: arm label -> the tuning choice its row carries (backends/tuning.py)."""
    check_arms(arms)
    set_threads(threads)
    sampled = Sampling(**(sampling or {}))
    dt = dtype_record(dtype, device)
    if require_dtype is not None and dt["dtype"] != require_dtype:
        raise ValueError(f"{dataset}: this job runs its {require_dtype} arms in dtype {dtype}, planned for a host "
                         f"where {dtype} is {require_dtype}; here it is {dt['dtype']} ({dt['dtype_reason']}). "
                         "Plan the DAG on this host class (config sizing.host: auto, or its class)")
    prompts = read_prompts(prompts_path, limit, skip)
    model = load_causal_lm(target_dir, dt["dtype"], device)
    tokenizer = load_tokenizer(target_dir)
    eos = eos_token_ids(model, tokenizer) if sampled.greedy else set()   # sampled rows: equal lengths

    context = getattr(model.config, "max_position_embeddings", None) or 10**9
    fits = [p for p in prompts if len(p["prompt_ids"]) + max_new_tokens + DRAFT_MARGIN <= context]
    skipped = [{"id": p["id"], "prompt_tokens": len(p["prompt_ids"]), "context": context}
               for p in prompts if p not in fits]
    if not fits:
        raise ValueError(f"{prompts_path}: no prompt fits the context of {context} tokens")

    # a peer's engine admits the longest prompt that fits, with its decode
    longest = max(len(p["prompt_ids"]) for p in fits) + max_new_tokens

    def runner(method, params):
        return _runner(model, method, params, max_new_tokens, eos, sampled, target_dir, longest)

    runners = {arm_label(a): runner(a["method"], a.get("params") or {}) for a in arms}
    runners[BASELINE] = runner(BASELINE, {})
    row_arms = arms + ([AA_CONTROL] if aa_control else [])
    if aa_control:
        runners[arm_label(AA_CONTROL)] = runner(BASELINE, {})
    names = list(runners)
    warmup_tokens = min(max_new_tokens, WARMUP_TOKENS)
    for i, p in enumerate(fits[:warmup]):
        for name in names:
            runners[name][0](p["prompt_ids"], i, warmup_tokens)  # allocator, kernels, caches; not recorded

    records = {name: [] for name in names}
    step_times: dict[tuple[str, int], list[float]] = {}
    costs_target, contexts = TargetModel(model), []
    bar = tqdm(fits, desc=f"{len(arms)} method(s) and the baseline on {dataset}", unit="prompt")
    for i, p in enumerate(bar):
        for name in balanced(names + [STEP_COSTS], i):
            if name == STEP_COSTS:   # one timed step per cell (time_cells), at the prompt's average decode position
                contexts.append(len(p["prompt_ids"]) + max_new_tokens // 2)
                for cell, ts in time_cells(costs_target, context_ids([p], contexts[-1]), 1, 0, first_round=i).items():
                    step_times.setdefault(cell, []).extend(ts)
                continue
            records[name].append(_record(p, runners[name][0](p["prompt_ids"], i), dataset, name))
        wall = {n: sum(r["wall_s"] for r in rs) for n, rs in records.items()}
        bar.set_postfix_str(" ".join(f"{n} {wall[BASELINE] / wall[n]:.2f}x"
                                     for n in names if n != BASELINE))
    for _, proposer in runners.values():
        if proposer is not None and hasattr(proposer, "close"):
            proposer.close()

    step_costs = curve_points(step_times, dtype=dt["dtype"], dataset=dataset,
                              context=round(sum(contexts) / len(contexts)))
    base = records[BASELINE]
    attach_baseline(base, base)
    # core.target's routes (pack_linears, fold_attention): every arm's, the model is shared
    route, attention = linear_route(model), model.config._attn_implementation
    rows = []
    for arm in row_arms:
        label = arm_label(arm)
        attach_baseline(records[label], base)
        settings = {"backend": "torch", "method": arm["method"], "variant": arm.get("variant"),
                    "params": arm.get("params") or {}, **dt, "device": device, "max_new_tokens": max_new_tokens,
                    "warmup_prompts": warmup, "warmup_tokens": warmup_tokens,
                    "prompts_file": str(prompts_path), "target": str(target_dir), "limit": limit, "skip": skip,
                    "linear_route": route, "attention_route": attention,
                    "ld_preload": os.environ.get("LD_PRELOAD") or None,
                    "arms": names, "arm_order": "balanced (Williams design) per prompt",
                    "compare_with": arm.get("compare_with"),
                    "sampling": sampled.to_dict(), "ignore_eos": not sampled.greedy}
        row = summarize(records[label], base, settings, skipped, resamples)
        peer = PEERS.get(arm["method"])
        row["draft_shape"] = (peer.draft_shape(arm.get("params") or {}) if peer
                              else getattr(runners[label][1], "draft_shape", None))
        row["step_costs"] = step_costs
        if tuning and label in tuning:
            row["tuning"] = tuning[label]
        if arm.get("compare_with"):
            row["same_run"] = same_run_comparison(records[label], records[arm["compare_with"]],
                                                  arm["compare_with"], resamples)
        rows.append(row)
    write_jsonl(out_records, [r for rs in records.values() for r in rs])
    out = {"dataset": dataset, "dtype": dt["dtype"], "step_costs": step_costs, "rows": rows}
    write_json(out_summary, out)
    return out


def same_run_comparison(records: list[dict], other: list[dict], counterpart: str, resamples: int) -> dict:
    """Our arm (`counterpart`) vs this arm (a peer), timed in one process on the same
    prompts: > 1 means ours is faster."""
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
