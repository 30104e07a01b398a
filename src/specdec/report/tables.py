"""results/rows.parquet, results/tables.md, the plots and the README's results section, all from
the benchmark summaries through one pandas frame (report.rows)."""
from __future__ import annotations

import json

import pandas as pd

from .. import methods
from .costcheck import TOLERANCE, job_curve
from .rows import HEADLINE

START, END = "<!-- results:start -->", "<!-- results:end -->"

DATASET_TITLES = {
    "chat_heldout": "Chat, held-out prompts (disjoint from training)",
    "chat_overlap": "Chat, train-overlap slice (the reference system's best-case probe: learned drafters "
                    "saw these completions)",
    "wiki": "Extractive Wikipedia (prompt embeds the articles)",
}
NOTES = (
    "Every speedup is paired: the method and the greedy baseline run in the same process on the "
    "same prompts, alternating prompt by prompt (vLLM batched: alternating rounds of the whole "
    "batch), and the bracket is its 95% interval (`speedup_ci_method` in `results/rows.parquet`). "
    "Speedup = baseline wall time / method wall time (aggregate); acceptance = accepted / drafted "
    "tokens; tau = tokens per target verification forward; matches = outputs equal to the "
    "baseline arm's, token for token. `auto` rows run in the host's speed dtype (bf16 where the "
    "CPU multiplies bf16 natively, else fp32); float32 rows are the lossless checks. Sampled rows "
    "(T > 0): both arms sample prompt i with seed i and decode max_new_tokens each (EOS ignored); "
    "their texts differ by design, so there is no token-by-token check: the distribution tests "
    "(tests/test_sampling.py, test_contract.py) prove sampling lossless.")


def _num(x, fmt):
    return "-" if x is None or pd.isna(x) else format(x, fmt)


def control_mark(r) -> str:
    """" (!)" on a row of a job whose negative control failed (mark_controls), else ""."""
    return " (!)" if isinstance(r.get("_control"), str) else ""


def speedup_cell(r) -> str:
    if pd.isna(r.get("speedup")):
        return "-"
    mark = control_mark(r)
    if pd.isna(r.get("ci_low")):
        return f"{r['speedup']:.2f}x{mark}"
    return f"{r['speedup']:.2f}x [{r['ci_low']:.2f}, {r['ci_high']:.2f}]{mark}"


def cost_cell(r) -> str:
    """Measured decode speedup / what the row's costs predict (report.costcheck), "unexplained"
    where they differ by more than TOLERANCE."""
    if pd.isna(r.get("predicted_decode_speedup")):
        return "-"
    mark = ", unexplained" if isinstance(r.get("_cost"), str) else ""
    return f"{r['decode_speedup']:.2f}x / {r['predicted_decode_speedup']:.2f}x{mark}"


def cost_flag_lines(frame: pd.DataFrame) -> list[str]:
    """The rows whose measured speedup their costs do not explain, each with why."""
    if "_cost" not in frame:
        return []
    flagged = frame[frame["_cost"].map(lambda x: isinstance(x, str))]
    if not len(flagged):
        return []
    lines = [f"**Speedups their costs do not explain.** Each PyTorch row's decode speedup is predicted from its "
             f"own tokens per step and drafting time and what verification steps cost in its job, timed between "
             f"its arms (`results/cost_curve.md`); these differ from it by more than {100 * TOLERANCE:.0f}% and are "
             "not results until explained:", ""]
    lines += [f"- {r['dataset']}, {path_name(r)}, {dtype_name(r)}, {r['label']}: {r['_cost']}."
              for _, r in flagged.iterrows()]
    return lines + [""]


def _is_null_drafter(method: str) -> bool:
    """A negative control of the registry (methods/null_drafter.py: drafts that are never accepted)."""
    return method in methods.names() and methods.is_control(method)


def lossless_check(rows: pd.DataFrame) -> pd.Series:
    """Rows of a float32 output-check job (vllm.lossless): their match counts are the result, and
    their speedups (a few short prompts) are neither results nor controls."""
    return rows["role"].eq("lossless") if "role" in rows else pd.Series(False, index=rows.index)


def control_flags(rows: pd.DataFrame) -> dict[tuple, str]:
    """The negative controls of each job (path, dtype, data set): the null drafter, whose speedup
    must not exceed 1.0 (its interval above 1.0: verifying drafts looks cheaper than a plain step,
    so every speedup there is inflated by at least its lower bound), and the A/A arm, whose interval
    must hold 1.0 (excluding it: two identical arms measured apart, so speedups there are off by
    about as much). -> {(job_name, dtype, dataset): what failed, by how much}."""
    out = {}
    timed = rows[rows["speedup"].notna() & rows["ci_low"].notna() & ~lossless_check(rows)]
    for _, r in timed.iterrows():
        key = (job_name(r), r["dtype"], r["dataset"])
        if _is_null_drafter(r["method"]) and r["ci_low"] > 1.0:
            why = (f"the null drafter ({r['label']}) read {r['speedup']:.2f}x [{r['ci_low']:.2f}, {r['ci_high']:.2f}], "
                   f"above 1.0: speedups here are inflated by at least {100 * (r['ci_low'] - 1):.0f}%")
        elif r["label"] == "baseline/aa" and not r["ci_low"] <= 1.0 <= r["ci_high"]:
            why = (f"the A/A arm read {r['speedup']:.2f}x [{r['ci_low']:.2f}, {r['ci_high']:.2f}], excluding 1.0: "
                   f"speedups here are off by about {100 * abs(r['speedup'] - 1):.0f}%")
        else:
            continue
        out[key] = f"{out[key]}; {why}" if key in out else why
    return out


def mark_controls(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """The frame with `_control` set on every row of a job whose control failed (speedup_cell
    marks them), and the failures."""
    flags = control_flags(frame)
    keys = [(job_name(r), r["dtype"], r["dataset"]) for _, r in frame.iterrows()]
    return frame.assign(_control=[flags.get(k) for k in keys]), flags


def matches_cell(r) -> str:
    if pd.isna(r.get("matches_baseline")):
        return "-"
    return f"{int(r['matches_baseline'])}/{int(r['prompts'])}"


def path_name(r) -> str:
    if r["backend"] == "vllm" and r.get("role") == "lossless":
        ours = ", our proposer" if r.get("proposer") == "specdec" else ""
        return f"vLLM serial, lossless check{ours}"
    if r["backend"] == "vllm":
        ours = ", our proposer" if r.get("proposer") == "specdec" else ""
        n = int(r["settings.requests_in_flight"])   # serial: 1; batched: the whole batch, up to max_num_seqs
        return f"vLLM {r['mode']} ({n} request{'s' if n > 1 else ''} in flight){ours}"
    if r["method"] in methods.PEERS:
        return f"{methods.PEERS[r['method']].title} (peer)"
    return "PyTorch loop"


def job_name(r) -> str:
    """The timing a row shares with its job's controls: its path, where vLLM's proposers and ours
    inside vLLM are one job (one baseline engine, the same interleaved steps)."""
    return path_name(r).removesuffix(", our proposer")


def sampling_note(rows: pd.DataFrame) -> str:
    """", sampled at T = 0.7 (top-p 1.0, top-k off)" for sampled rows, "" for greedy ones."""
    sampled = rows[rows["temperature"] > 0]
    if not len(sampled):
        return ""
    r = sampled.iloc[0]
    top_k, seed = r.get("settings.sampling.top_k"), int(r.get("settings.sampling.seed", 0))
    return (f", sampled at T = {r['temperature']:g} (top-p {r.get('settings.sampling.top_p', 1.0):g}, "
            f"top-k {'off' if not top_k else int(top_k)}, prompt i with seed {seed} + i)")


def base_dataset(frame: pd.DataFrame, ds: str) -> str:
    """A sampled set's greedy counterpart: the titled set that reads the same prompt file."""
    if ds in DATASET_TITLES or "settings.prompts_file" not in frame:
        return ds
    files = frame.loc[frame["dataset"] == ds, "settings.prompts_file"]
    same = frame[frame["settings.prompts_file"].isin(files) & (frame["temperature"] == 0)]
    return next((d for d in same["dataset"].unique() if d in DATASET_TITLES), ds)


def dataset_order(frame: pd.DataFrame) -> list[str]:
    """Titled sets in their order, each sampled set right after its greedy counterpart."""
    order = list(DATASET_TITLES)
    def key(ds):
        base = base_dataset(frame, ds)
        return (order.index(base) if base in order else len(order), base != ds, ds)
    return sorted(frame["dataset"].unique(), key=key)


def dataset_title(frame: pd.DataFrame, ds: str) -> str:
    base = base_dataset(frame, ds)
    return DATASET_TITLES.get(base, base) + sampling_note(frame[frame["dataset"] == ds])


def dtype_name(r) -> str:
    return r["dtype"] if r["dtype_requested"] != "auto" else f"{r['dtype']} (auto)"


def table(frame: pd.DataFrame, columns: dict) -> str:
    """A markdown table: columns maps a header to a function of the row."""
    out = pd.DataFrame({head: [fn(r) for _, r in frame.iterrows()] for head, fn in columns.items()})
    return out.to_markdown(index=False)


ROW_COLUMNS = {
    "Path": path_name,
    "Method": lambda r: r["label"],
    "Draft": lambda r: r.get("draft_shape") if isinstance(r.get("draft_shape"), str) else "-",
    "Dtype": dtype_name,
    "Prompts": lambda r: _num(r.get("prompts"), ".0f"),
    "Speedup [95% CI]": speedup_cell,
    "Median prompt speedup": lambda r: _num(r.get("median_prompt_speedup"), ".2f"),
    "Acceptance": lambda r: _num(100 * r["acceptance_rate"] if pd.notna(r.get("acceptance_rate")) else None, ".1f")
    + ("%" if pd.notna(r.get("acceptance_rate")) else ""),
    "Tau": lambda r: _num(r.get("tau"), ".2f"),
    "Draft / target ms per step": lambda r: "-" if pd.isna(r.get("draft_ms_per_step"))
    else f"{r['draft_ms_per_step']:.1f} / {r['target_ms_per_step']:.1f}",
    "Decode speedup / predicted": cost_cell,
    "Baseline tok/s": lambda r: _num(r.get("baseline_throughput_tok_s"), ".1f"),
    "Method tok/s": lambda r: _num(r.get("throughput_tok_s"), ".1f"),
    "Matches baseline": matches_cell,
}


def host_lines(frame: pd.DataFrame, sizing: str | None = None) -> list[str]:
    """Which host class produced these rows: CPU model, ISA level, native bf16, the speed dtype,
    and the DAG's size for that class (`sizing`: the workflow's line on config `sizing`)."""
    cols = ["environment.cpu.cpu_model", "environment.cpu.isa", "environment.cpu.native_bf16",
            "environment.cpu.bf16_flags"]
    if not set(cols) <= set(frame.columns):
        return []
    lines = []
    for values, _ in frame.groupby(cols, dropna=False):
        model, isa, native, flags = values
        flags = ", ".join(json.loads(flags)) if isinstance(flags, str) else ""
        lines.append(f"Host: {model}, ISA {isa}, native bf16 matmuls: {'yes (' + flags + ')' if native else 'no'}.")
    auto = frame[frame["dtype_requested"] == "auto"]
    for (dtype, reason), _ in auto.groupby(["dtype", "settings.dtype_reason"]):
        lines.append(f"Speed dtype (`auto`): {dtype} ({reason}).")
    if sizing:
        lines.append(f"DAG size: {sizing}.")
    return lines


def vllm_cell(rows: pd.DataFrame) -> str:
    """A vLLM row's speedup in the headline ("-": no row, or vLLM refused the method)."""
    ok = rows[rows["speedup"].notna()]
    if not len(ok):
        return "-"
    return f"{ok['speedup'].iloc[0]:.2f}x{control_mark(ok.iloc[0])}"


def headline(frame: pd.DataFrame) -> str:
    """One row per method: held-out speedup first, vLLM's on the same held-out set, the
    train-overlap probe beside it, and the fp32 lossless check."""
    torch_rows = frame[(frame["backend"] == "torch") & ~frame["method"].isin(list(methods.PEERS))]
    held = frame[frame["headline"]]
    # vLLM's own implementation of the method, greedy, on the held-out set
    vllm = frame[frame["backend"] == "vllm"]
    vllm_held = vllm[(vllm["dataset"] == HEADLINE["dataset"]) & (vllm["proposer"] == "vllm") & ~lossless_check(vllm)]
    # vLLM's float32 output check (vllm.lossless), vLLM's implementation of the method
    vllm_fp32 = vllm[lossless_check(vllm) & (vllm["proposer"] == "vllm")]
    # the train-overlap probe in the held-out rows' dtype; where two jobs ran in it (a float32
    # host planned as a bf16 one, as the smoke config is), the auto job's
    over = torch_rows[(torch_rows["dataset"] == "chat_overlap") & torch_rows["dtype"].isin(held["dtype"])]
    over = over.sort_values("dtype_requested", key=lambda s: s.ne("auto"), kind="stable")
    fp32 = torch_rows[(torch_rows["dtype"] == "float32") & (torch_rows["temperature"] == 0)]
    # the same held-out prompts sampled at T > 0, in the speed dtype
    sampled = torch_rows[(torch_rows["temperature"] > 0) & (torch_rows["dtype_requested"] == "auto")]
    if "settings.prompts_file" in frame:
        sampled = sampled[sampled["settings.prompts_file"].isin(held["settings.prompts_file"])]
    rows = []
    predicted = held.get("predicted_decode_speedup", pd.Series()).notna().any()
    for _, h in held.sort_values("speedup", ascending=False).iterrows():
        o = over[over["method"] == h["method"]]
        checks = fp32[fp32["method"] == h["method"]]
        at_t = {}
        for t, rows_t in sampled.groupby("temperature"):
            mine = rows_t[rows_t["method"] == h["method"]]
            at_t[f"Held-out T={t:g} speedup [95% CI]"] = speedup_cell(mine.iloc[0]) if len(mine) else "-"
        rows.append({
            "Method": h["label"],
            "Held-out speedup [95% CI]": speedup_cell(h),
            "Held-out acceptance": _num(100 * h["acceptance_rate"], ".0f") + "%"
            if pd.notna(h.get("acceptance_rate")) else "-",
            "Held-out tau": _num(h.get("tau"), ".2f"),
            **({"Decode speedup / its costs predict": cost_cell(h)} if predicted else {}),
            **at_t,
            **({"vLLM held-out speedup, serial / batched": " / ".join(
                vllm_cell(vllm_held[(vllm_held["method"] == h["method"]) & (vllm_held["mode"] == mode)])
                for mode in ("serial", "batched"))} if len(vllm_held) else {}),
            **({"Train-overlap speedup (best case)": speedup_cell(o.iloc[0]) if len(o) else "-",
                "Train-overlap tau": _num(o.iloc[0].get("tau"), ".2f") if len(o) else "-"} if len(over) else {}),
            "Lossless (fp32 matches)": ", ".join(f"{matches_cell(c)}" for _, c in checks.iterrows()) or "-",
            **({"vLLM lossless (fp32 matches)": ", ".join(
                matches_cell(c) for _, c in vllm_fp32[vllm_fp32["method"] == h["method"]].iterrows()) or "-"}
               if len(vllm_fp32) else {}),
        })
    if not rows:
        return ""
    return pd.DataFrame(rows).to_markdown(index=False, disable_numparse=True)


def peer_lines(frame: pd.DataFrame) -> list[str]:
    out = []
    for _, r in frame[frame.get("same_run.counterpart", pd.Series(index=frame.index)).notna()].iterrows():
        lo, hi = json.loads(r["same_run.counterpart_speedup_ci"])
        out.append(f"- {r['label']} ({r['dataset']}, {dtype_name(r)}): ours ({r['same_run.counterpart']}) ran "
                   f"**{r['same_run.counterpart_speedup']:.2f}x** [{lo:.2f}, {hi:.2f}] its speed, same "
                   f"process, alternating; identical outputs on {int(r['same_run.same_outputs'])}/"
                   f"{int(r['prompts'])} prompts.")
    baseline_peer = frame["method"].map(lambda m: m in methods.PEERS and methods.PEERS[m].baseline).astype(bool)
    for _, r in frame[baseline_peer & frame["speedup"].notna()].iterrows():
        out.append(f"- {methods.PEERS[r['method']].title} ({r['dataset']}, {dtype_name(r)}): our baseline loop ran "
                   f"**{1 / r['speedup']:.2f}x** [{1 / r['ci_high']:.2f}, {1 / r['ci_low']:.2f}] its speed "
                   f"({r['baseline_throughput_tok_s']:.1f} against {r['throughput_tok_s']:.1f} tok/s).")
    return out


def tuned_lines(frame: pd.DataFrame) -> list[str]:
    """Each tuned variant (backends/tuning.py): what was chosen, on what, and its held-out row
    beside its fixed variant's."""
    if "tuning.fixed" not in frame:
        return []
    fixed_rows = frame[frame["tuning.fixed"].notna() & frame["label"].eq(frame["tuning.fixed"])]
    out = []
    for _, f in fixed_rows.iterrows():
        same = (frame["dataset"] == f["dataset"]) & (frame["dtype_requested"] == f["dtype_requested"])
        tuned = frame[same & frame["label"].eq(f"{f['method']}/{f['tuning.variant']}")]
        chosen = ("the fixed variant itself" if f["tuning.same_as_fixed"] else f"{f['tuning.chosen']}, "
                  f"predicted {f['tuning.predicted_decode_speedup']:.2f}x against the fixed variant's "
                  f"{f['tuning.fixed_predicted_decode_speedup']:.2f}x")
        measured = (f"fixed {speedup_cell(f)}" + (f", tuned {speedup_cell(tuned.iloc[0])}" if len(tuned) else ""))
        out.append(f"- {f['dataset']}, {path_name(f)}, {dtype_name(f)}: {f['label']} tuned to {chosen}; "
                   f"here: {measured}.")
    if not out:
        return []
    return ["## Tuned variants", "",
            "Each variant's draft length or tree size for this host, chosen on records of its prompt file that "
            "no benchmark reads (`results/tuning/`), as the candidate whose costs (tokens per step, drafting time, "
            "the cost curve's verification) predict the highest decode speedup; the tuned variant (`.tuned`) is "
            "timed beside the fixed one in the same job:", "", *out, ""]


def acceptance_table(rows: pd.DataFrame) -> str:
    per_pos = {r["label"] + f" ({path_name(r)}, {dtype_name(r)})": json.loads(r["acceptance_by_position"])
               for _, r in rows.iterrows() if isinstance(r.get("acceptance_by_position"), str)
               and json.loads(r["acceptance_by_position"])}
    if not per_pos:
        return ""
    width = max(len(v) for v in per_pos.values())
    data = {"Method": list(per_pos)}
    for i in range(width):
        data[f"pos {i + 1}"] = [f"{100 * v[i]:.1f}%" if i < len(v) else "-" for v in per_pos.values()]
    return pd.DataFrame(data).to_markdown(index=False)


def render_tables(frame: pd.DataFrame, sizing: str | None = None) -> str:
    lines = ["# Benchmark results", "", "Generated by `snakemake results/tables.md` from the benchmark "
             "summaries (every field: `results/rows.parquet`). " + NOTES, ""]
    lines += host_lines(frame, sizing) + [""]
    frame, flags = mark_controls(frame)
    if flags:
        lines += ["**Failed controls.** Speedups marked (!) come from a job whose negative control failed; read "
                  "them with the margin its control shows:", ""]
        lines += [f"- {ds}, {path}, {dtype}: {why}." for (path, dtype, ds), why in flags.items()] + [""]
    lines += cost_flag_lines(frame)
    head = headline(frame)
    if head:
        lines += ["## Headline: chat held-out, PyTorch loop, speed dtype", "", head, ""]
    peers = peer_lines(frame)
    if peers:
        lines += ["## Peers (other engines), timed in the same job", ""] + peers + [""]
    lines += tuned_lines(frame)
    for ds in dataset_order(frame):
        rows = frame[frame["dataset"] == ds]
        lines += [f"## {dataset_title(frame, ds)}", ""]
        errors = rows[rows.get("error", pd.Series(index=rows.index)).notna()]
        ok = rows.drop(errors.index)
        if len(ok):
            ok = ok.assign(_path=[path_name(r) for _, r in ok.iterrows()]).sort_values(["_path", "dtype", "label"])
            lines += [table(ok, ROW_COLUMNS), ""]
        for _, r in errors.iterrows():
            lines.append(f"- {path_name(r)}, {r['label']}: not run: {r['error'].splitlines()[0][:300]}")
        if len(errors):
            lines.append("")
        acc = acceptance_table(ok)
        if acc:
            lines += [f"Acceptance by draft position ({ds}): share of drafting steps whose first i+1 draft "
                      "tokens were all accepted.", "", acc, ""]
    return "\n".join(lines)


def proxy_key(eval_proxy: dict) -> str:
    """The eval proxy's accuracy list: per Medusa head, MTP module, EAGLE-3 step or draft position."""
    return next(k for k in eval_proxy["heldout"] if k.startswith(("top1_accuracy", "accuracy")))


def learning_curve_frame(ckpt_dirs) -> pd.DataFrame:
    """One row per checkpoint of a learning curve: training records, steps, passes over the
    records, and the first draft position's held-out and train-overlap accuracy."""
    from ..train.checkpoint import checkpoint_record
    rows = []
    for d in ckpt_dirs:
        p, c = checkpoint_record(d)
        records = c["train"].get("train_records")
        if records is None:
            raise ValueError(f"{p}: checkpoint config has no train.train_records (retrain it)")
        ev, steps, batch = c["eval_proxy"], c["train"]["steps"], c["train"]["batch_size"]
        key = proxy_key(ev)
        rows.append({"checkpoint": d, "method": c["method"], "records": records, "steps": steps,
                     "passes": steps * batch / records if methods.examples_unit(c["method"]) == "records" else None,
                     "heldout_step1": ev["heldout"][key][0], "overlap_step1": ev["overlap"][key][0]})
    return pd.DataFrame(rows).sort_values("records")


def render_learning_curve(curve: pd.DataFrame) -> str:
    if not len(curve):
        return ""
    shown = curve.assign(**{
        "Checkpoint": curve["checkpoint"], "Train records": curve["records"], "Steps": curve["steps"],
        "Passes over the records": curve["passes"].map(lambda x: _num(x, ".1f")),
        "Held-out step-1 accuracy": curve["heldout_step1"].map(lambda x: f"{100 * x:.1f}%"),
        "Train-overlap step-1 accuracy": curve["overlap_step1"].map(lambda x: f"{100 * x:.1f}%")})
    cols = ["Checkpoint", "Train records", "Steps", "Passes over the records", "Held-out step-1 accuracy",
            "Train-overlap step-1 accuracy"]
    return "\n".join(["## Learning curve", "",
                      "One proposer trained with the same settings and steps on the first N training records: "
                      "its teacher-forced top-1 accuracy at the first draft position on the held-out chat "
                      "prompts' greedy completions.", "", shown[cols].to_markdown(index=False), ""])


def render_checkpoints(ckpt_dirs) -> str:
    """The trained proposers: training cost and the eval proxy (accuracy per head / module /
    draft position)."""
    if not ckpt_dirs:
        return ""
    from ..train.checkpoint import checkpoint_record  # imports torch: only where checkpoints are listed

    rows = []
    for d in ckpt_dirs:
        p, c = checkpoint_record(d)
        for key in ("method", "train", "eval_proxy", "train_log"):
            if key not in c:
                raise ValueError(f"{p}: checkpoint config has no field {key!r}")
        ev = c["eval_proxy"]
        acc_key = proxy_key(ev)
        fmt = lambda xs: " / ".join(f"{100 * x:.1f}%" for x in xs)
        log = [r for r in c["train_log"] if "loss" in r]
        rows.append({"Checkpoint": d, "Train records": c["train"].get("train_records", "-"),
                     "Steps x batch": f"{c['train']['steps']} x {c['train']['batch_size']}",
                     "Dtype": c["train"].get("dtype", "float32"),
                     "Train time": f"{_num(c.get('train_seconds'), '.0f')}s",
                     "Final train loss": _num(log[-1]["loss"] if log else None, ".3f"),
                     "Train-overlap accuracy": fmt(ev["overlap"][acc_key]),
                     "Held-out accuracy": fmt(ev["heldout"][acc_key])})
    return "\n".join(["## Trained checkpoints", "",
                      "Eval proxy: teacher-forced top-1 accuracy on the target's greedy completions, per "
                      "Medusa head (head k predicts token t+1+k), MTP module, EAGLE-3 TTT step, or draft "
                      "position; train-overlap = the first training records, held-out = the held-out "
                      "chat prompts.", "", pd.DataFrame(rows).to_markdown(index=False), ""])


def cost_account_lines(frame: pd.DataFrame) -> list[str]:
    """Each headline method's figure in one line (report.costcheck): what drafting costs, what
    verification costs, what its tokens per step buy; then a blank line."""
    if "cost_account" not in frame:
        return []
    held = frame[frame["headline"] & frame["cost_account"].notna()].sort_values("speedup", ascending=False)
    if not len(held):
        return []
    lines = ["What each held-out figure is made of, in plain decoding steps of the baseline (verification "
             "costs timed in the row's job: [`results/cost_curve.md`](results/cost_curve.md)):", ""]
    unexplained = " (unexplained: see the tables)"
    lines += [f"- {r['label']}: {r['cost_account']}{unexplained if isinstance(r.get('_cost'), str) else ''}."
              for _, r in held.iterrows()]
    return lines + [""]


def render_readme_section(frame: pd.DataFrame, tables_path: str, plot: str | None, sizing: str | None = None) -> str:
    """The README's results: the host, the headline table (one row per method), where the rest is."""
    sampled = frame[(frame["backend"] == "torch") & (frame["temperature"] > 0)]
    sampled_note = "" if not len(sampled) else (
        f"Held-out T={sampled['temperature'].iloc[0]:g}: {int(sampled['prompts'].max())} of the held-out prompts "
        "sampled, both arms with the same seeds and every token decoded (lossless in distribution: the "
        "sampling tests). ")
    frame, flags = mark_controls(frame)
    head = headline(frame)
    failed = sorted({f"{path} on {ds}" for (path, _, ds) in flags})
    control_note = ("" if not failed else
                    f"(!): a job whose negative control failed ({'; '.join(failed)}): not a result; the margins are "
                    "in the tables. ")
    overlap_note = ("Train-overlap: prompts whose completions the learned drafters were trained on (the reference "
                    "system's best-case probe). ") if "Train-overlap" in head else ""
    accounts = cost_account_lines(frame)
    lines = [*host_lines(frame, sizing), "", head, "", *accounts,
             "Held-out: the PyTorch loop, the host's speed dtype, prompts no drafter saw in training. "
             + sampled_note + overlap_note + control_note +
             "Speedups are paired with the baseline in one process, with 95% "
             f"intervals; lossless: fp32 outputs equal to the baseline's. Every row, vLLM included: "
             f"[`{tables_path}`]({tables_path})."]
    if plot:
        lines += ["", f"![speedup]({plot})"]
    return "\n".join(lines)


CSV_COLUMNS = ["backend", "mode", "dataset", "dtype", "method", "variant", "proposer", "prompts", "speedup", "ci_low",
               "ci_high", "acceptance_rate", "tau", "matches_baseline", "throughput_tok_s",
               "baseline_throughput_tok_s", "error"]


HTML_STYLE = ("table{border-collapse:collapse;font:12px sans-serif}"
              "th,td{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#eee}")


def rows_html(frame: pd.DataFrame) -> str:
    """The CSV's rows as a page the Snakemake report shows inline (it only offers a CSV as a
    download)."""
    table = frame.reindex(columns=CSV_COLUMNS).to_html(index=False, na_rep="-", border=0,
                                                       float_format=lambda x: f"{x:.4g}")
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><style>{HTML_STYLE}</style></head>"
            f"<body>{table}</body></html>\n")


def job_step_cost_lines(costs: pd.DataFrame, points: pd.DataFrame) -> list[str]:
    """Each benchmark job's own step costs (backends/torch_bench.py: STEP_COSTS) beside this
    curve's, for the chain sizes the headline chains use."""
    rows = []
    for _, r in costs.drop_duplicates("summary_path").iterrows():
        own = job_curve(r)
        if own is None:
            continue
        cell = points[(points["dtype"] == r["dtype"]) & (points["dataset"] == r["dataset"])]
        entry = {"Job": f"{r['dataset']}, {dtype_name(r)}", "Context": int(own["context"].iloc[0])}
        for label, frame in (("job", own), ("curve", cell)):
            chain = frame[frame["shape"] == "chain"].set_index("nodes")
            if 1 not in chain.index:
                continue
            entry[f"Plain step ms ({label})"] = _num(chain.loc[1, "ms"], ".1f")
            entry[f"Chain 2 / 4 / 6 nodes, plain steps ({label})"] = " / ".join(
                _num(chain["plain_steps"].get(n), ".2f") for n in (2, 4, 6))
        rows.append(entry)
    if not rows:
        return []
    return ["## Step costs timed in each benchmark job", "",
            "Every PyTorch job also times the cells of this curve, once per prompt, between its arms (the "
            "pseudo-arm `step costs`): the reference its rows are checked against, since a shared host can run "
            "faster or slower in another job, and not alike for one-token and many-token steps. The medians, "
            "beside this curve's:", "", pd.DataFrame(rows).to_markdown(index=False, disable_numparse=True), ""]


def render_cost_curve(curve: dict, points: pd.DataFrame, frame: pd.DataFrame) -> str:
    """results/cost_curve.md: the host, its bandwidth and weight-read floor per dtype, the
    verification step of n nodes per (dtype, set) in ms and in plain steps (`points`, from
    costcheck.read_curve), and each PyTorch row's drafting cost measured in its job."""
    host = curve["host"]
    lines = ["# The host's cost curve", "",
             "Generated by `snakemake results/tables.md` (job `cost_curve`, `src/specdec/backends/cost_curve.py`). "
             "A verification step of n nodes is the pending token and n - 1 draft tokens, run through the "
             "decoding loop's own step (target forward, verifier, KV commit), as a chain or as a binary tree; "
             "n = 1 is the baseline's plain step. Each cell is the median of "
             f"{curve['repeats']} timings, the sizes interleaved, at the set's context (mean prompt + half the "
             "decode). Plain steps = the cell / n = 1 of the same dtype and set: what the report's speedup "
             "check (`src/specdec/report/costcheck.py`) reads.", "",
             f"Host: {host['cpu_model']}, ISA {host['isa']}, native bf16 matmuls: "
             f"{'yes' if host['native_bf16'] else 'no'}; {curve['torch_threads']} torch threads; memory read "
             f"bandwidth {curve['memory_read_gb_s']:.1f} GB/s.", ""]
    for f in curve["floors"]:
        lines.append(f"- {f['dtype']}: {f['weight_bytes'] / 1e6:.0f} MB of weights, so no step is faster than "
                     f"{f['weight_read_floor_ms']:.1f} ms (the weight-read floor).")
    lines.append("")
    for (dtype, ds), cell in points.groupby(["dtype", "dataset"], sort=False):
        wide = cell.pivot_table(index="nodes", columns="shape", values=["ms", "plain_steps"])
        out = pd.DataFrame({"Nodes": wide.index})
        for shape in ("chain", "tree"):
            if ("ms", shape) in wide:
                out[f"{shape} ms"] = [_num(x, ".1f") for x in wide[("ms", shape)]]
                out[f"{shape} plain steps"] = [_num(x, ".2f") for x in wide[("plain_steps", shape)]]
        floor = next((f["weight_read_floor_ms"] for f in curve["floors"] if f["dtype"] == dtype), None)
        plain = cell[(cell["shape"] == "chain") & (cell["nodes"] == 1)]["ms"].iloc[0]
        lines += [f"## {dtype}, {ds} (context {int(cell['context'].iloc[0])} tokens)", "",
                  f"Plain step {plain:.1f} ms" + (f", {plain / floor:.1f}x the weight-read floor." if floor else "."),
                  "", out.to_markdown(index=False, disable_numparse=True), ""]
    costs = frame[frame["draft_cost"].notna()] if "draft_cost" in frame else frame[:0]
    if len(costs):
        shown = pd.DataFrame({
            "Set": costs["dataset"], "Dtype": [dtype_name(r) for _, r in costs.iterrows()], "Method": costs["label"],
            "Draft": [ROW_COLUMNS["Draft"](r) for _, r in costs.iterrows()],
            "Draft ms per step": [_num(x, ".1f") for x in costs["draft_ms_per_step"]],
            "Drafting, plain steps": [_num(x, ".2f") for x in costs["draft_cost"]],
            "Verification, plain steps (step costs / measured)":
                [f"{a:.2f} / {b:.2f}" for a, b in zip(costs["verify_cost"], costs["verify_cost_measured"])],
            "Tokens per step": [_num(x, ".2f") for x in costs["tokens_per_step"]],
            "Decode speedup / predicted": [cost_cell(r) for _, r in costs.iterrows()]})
        lines += job_step_cost_lines(costs, points)
        lines += ["## Each PyTorch row's costs", "",
                  "Drafting: the row's draft ms per decode step over its job's plain step; verification: what "
                  "a step of the row's mean draft costs by the step costs timed in its job (by this curve where "
                  "a row has none), and what the row's own steps measured; predicted = tokens per step / "
                  "(drafting + verification).", "", shown.to_markdown(index=False, disable_numparse=True), ""]
    return "\n".join(lines)
