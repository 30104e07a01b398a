"""The host's cost curve: what one verification step of n nodes costs the target, per dtype, at
each benchmark set's context length; and the weight-read floor of a step.

A step of n nodes is the pending token and n - 1 draft tokens, run by core.loop.verify_step (the
decoding loop's own step: one TargetModel forward, the verifier, the KV commit), as a chain or as
a tree mask. The tree is binary (node i's parent is (i - 1) // 2), so its depth grows like log n;
n = 1 is a plain decoding step, the baseline's, and n <= 2 trees are chains. After each step the
cache is cut back to the context, so every size runs at the same length:
  context = mean prompt length of the set's benchmarked prompts + max_new_tokens / 2
(a decode's average position). The sizes run interleaved, in an order balanced over the
repeats (core.stats.balanced), each timed on its second step in a row (time_cells), and each
cell's figure is its median, so a slow spell of the machine spreads over every size instead of
bending the curve.

The weight-read floor is the target's weight bytes over the host's memory read bandwidth
(host.memory_read_gb_s): a step of a small model on a CPU reads every weight once, so no step is
faster than that. The report divides each cell by the plain step of its (dtype, set): the curve
in plain steps, which report.costcheck uses to predict every PyTorch row's speedup.
"""
from __future__ import annotations

import statistics
import time

import torch
from tqdm import tqdm

from ..core.loop import Draft, verify_step
from ..core.stats import balanced
from ..core.target import TargetModel
from ..data.records import read_prompts, write_json
from ..host import capability, dtype_record, memory_read_gb_s, set_threads
from ..models import load_causal_lm

SIZES = (1, 2, 3, 4, 6, 8, 12, 16)   # nodes per verification step: the pending token + drafts
SHAPES = ("chain", "tree")
SETTLE = 1   # untimed steps of a cell's size before its timed one (time_cells)


def tree_parents(drafts: int) -> list[int]:
    """Draft.parents of a binary tree of `drafts` tokens under the pending token (node 0): node
    i >= 1 hangs under node (i - 1) // 2. Draft token j is node j + 1, so its parent node is
    j // 2, which is draft token j // 2 - 1 (-1: the pending token)."""
    return [j // 2 - 1 for j in range(drafts)]


def step_draft(shape: str, nodes: int, tokens: list[int]) -> Draft | None:
    """The draft of an n-node step (None: a plain step), drawn from `tokens`."""
    if nodes == 1:
        return None
    drafts = tokens[: nodes - 1]
    return Draft.chain(drafts) if shape == "chain" else Draft(drafts, tree_parents(nodes - 1))


def cells(sizes=SIZES, shapes=SHAPES) -> list[tuple[str, int]]:
    """(shape, nodes) to time: a tree of one or two nodes is a chain, so trees start at 3."""
    return [(s, n) for s in shapes for n in sizes if s == "chain" or n >= 3]


def context_ids(prompts: list[dict], length: int) -> list[int]:
    """`length` tokens of real text: the prompts' ids, concatenated, cut to length."""
    ids = [t for p in prompts for t in p["prompt_ids"]]
    while len(ids) < length:
        ids = ids + ids
    return ids[:length]


@torch.inference_mode()
def time_cells(target: TargetModel, context: list[int], repeats: int, warmup: int,
               sizes=SIZES, shapes=SHAPES, desc: str = "", first_round: int = 0) -> dict[tuple[str, int], list[float]]:
    """Seconds of each (shape, nodes) verification step after `context`: `repeats` timings per
    cell, the cells interleaved (round r in core.stats.balanced order r; the rounds counted from
    `first_round`) after `warmup` untimed rounds. A cell runs SETTLE untimed steps of its size
    before the timed one: a decode repeats one step size, so the timed step is a repeated one, not
    the first after a change of size (new allocation sizes, a kernel's first call on a shape)."""
    target.prefill(context[:-1])
    pending, length = context[-1], target.cached
    draws = context[::-1]   # draft tokens: real token ids, the context read backwards (repeated)
    draws = draws * (max(sizes) // len(draws) + 1)
    todo = cells(sizes, shapes)
    times: dict[tuple[str, int], list[float]] = {c: [] for c in todo}
    for r in tqdm(range(warmup + repeats), desc=desc, unit="round", leave=False, disable=not desc):
        for shape, nodes in balanced(todo, first_round + r):
            draft = step_draft(shape, nodes, draws)
            for _ in range(SETTLE):
                verify_step(target, pending, draft, (), None)
                target.truncate(length)
            t = time.perf_counter()
            verify_step(target, pending, draft, (), None)
            dt = time.perf_counter() - t
            target.truncate(length)   # back to the context: every step runs at the same length
            if r >= warmup:
                times[(shape, nodes)].append(dt)
    return times


def curve_points(times: dict[tuple[str, int], list[float]], **fields) -> list[dict]:
    """time_cells' timings as the curve's points, each with `fields` (dtype, dataset, context):
    ms, the cell's median; plain_steps, that over the plain step's median."""
    plain = statistics.median(times[("chain", 1)])
    return [{**fields, "shape": shape, "nodes": nodes, "ms": 1000 * statistics.median(ts),
             "plain_steps": statistics.median(ts) / plain, "repeats": len(ts),
             "ms_min": 1000 * min(ts), "ms_max": 1000 * max(ts)}
            for (shape, nodes), ts in times.items()]


def weight_bytes(model) -> int:
    """Bytes of the model's parameters (a tied embedding and LM head counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def context_length(prompts: list[dict], max_new_tokens: int) -> int:
    """A decode's average position: mean prompt length + half the decode."""
    return round(statistics.mean(len(p["prompt_ids"]) for p in prompts) + max_new_tokens / 2)


def cost_curve(*, target_dir: str, sets: dict[str, dict], dtypes: list[str], out: str, device: str = "cpu",
               threads: int = 0, repeats: int = 10, warmup: int = 2, sizes=SIZES) -> dict:
    """Time the cost curve of every dtype and benchmark set and write it to `out` (JSON).
    sets: {name: {"prompts": path, "limit": n or None, "max_new_tokens": n}}, the benchmark
    settings whose context the curve is measured at. dtypes: names for host.dtype_record
    ("auto" is resolved; a dtype listed twice after resolving is timed once)."""
    if not sets:
        raise ValueError("cost curve: no benchmark sets to measure at")
    for name, spec in sets.items():
        missing = {"prompts", "max_new_tokens"} - set(spec)
        if missing:
            raise ValueError(f"cost curve set {name!r}: missing field(s) {sorted(missing)}")
    set_threads(threads)
    prompts = {name: read_prompts(spec["prompts"], spec.get("limit")) for name, spec in sets.items()}
    contexts = {name: context_length(prompts[name], spec["max_new_tokens"]) for name, spec in sets.items()}
    resolved = {}
    for requested in dtypes:
        rec = dtype_record(requested, device)
        resolved.setdefault(rec["dtype"], rec)
    points, floors = [], []
    bandwidth = memory_read_gb_s()
    for dtype, rec in resolved.items():
        model = load_causal_lm(target_dir, dtype, device)
        target = TargetModel(model)
        wb = weight_bytes(model)
        floors.append({"dtype": dtype, "dtype_reason": rec["dtype_reason"], "weight_bytes": wb,
                       "linear_route": target.linear_route, "attention_route": target.attention_route,
                       "weight_read_floor_ms": 1000 * wb / (bandwidth * 1e9)})
        for name in sets:
            ctx = context_ids(prompts[name], contexts[name])
            times = time_cells(target, ctx, repeats, warmup, sizes, desc=f"{dtype} {name} (context {len(ctx)})")
            points += curve_points(times, dtype=dtype, dataset=name, context=len(ctx))
        del target, model
    result = {"host": capability(), "memory_read_gb_s": bandwidth, "torch_threads": torch.get_num_threads(),
              "device": device, "sizes": list(sizes), "repeats": repeats, "warmup": warmup,
              "contexts": contexts, "floors": floors, "points": points}
    write_json(out, result)
    return result
