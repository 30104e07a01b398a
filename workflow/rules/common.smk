# Thin accessors for the rules. What runs is decided by the plan (specdec.plan: the jobs, their
# arms, rows and inputs); this file builds it from the merged config and names a few paths.
import os
import re
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from specdec import deps  # noqa: E402  (src/ is on sys.path: the Snakefile)
from specdec.plan import ABLATION_HIDDEN, DATASET_FILES, HIDDEN, Plan, spec_file  # noqa: E402

# the plan of the merged config; it adds the learning curve's and the ablation's checkpoints to
# config["train"]["checkpoints"], and raises on a config that plans no valid DAG
PLAN = Plan(config, SIZED_FOR, SIZING)
VLLM_JOBS = PLAN.vllm_jobs
BENCH_DATASETS = "|".join(config["bench"]["datasets"])
TARGET_DIR = f"checkpoints/{config['target']['name']}"
TARGET = f"{TARGET_DIR}/manifest.json"  # written last: the checkpoint is complete


def code(verb):
    """A job's code inputs: the files its `python -m specdec <verb>` loads, from the import graph
    (specdec.deps), relative to the working directory; a method's own files come from the registry
    (PLAN.method_sources)."""
    return deps.as_inputs(deps.verb_code(verb))


# Jobs run `python -m specdec`: put the interpreter running snakemake (the project venv) first on
# PATH, so `.venv/bin/snakemake ...` works without activating the venv. --use-conda overrides it.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
CONDA_ENV = str(Path(workflow.basedir) / "envs" / ("cuda.yaml" if config["device"].startswith("cuda") else "cpu.yaml"))


def rule_threads(rule):
    """The cores a job claims from the scheduler. "all": every core Snakemake may use (--cores),
    so that no other job runs beside it (the benchmarks: a timed job has the machine to itself,
    whatever --cores is). A job's torch threads are the `threads` config key (0: every core the
    job can see), not this claim."""
    threads = PLAN.rule_spec(rule)["threads"]
    if threads != "all":
        return threads
    try:
        return workflow.cores
    except WorkflowError:  # a cluster executor and no --cores: the profile's set-threads decides
        return 1


rule_resources = PLAN.rule_resources


def job_spec(rule, *wildcard_names):
    """An input function: the spec file of a job (specdec.plan.spec_file, keyed by the named
    wildcards and named by its content), written from the plan as the DAG is built. No job writes
    it: a spec costs no Snakemake job."""
    def spec(wc):
        key = "/".join(wc[name] for name in wildcard_names)
        return spec_file(rule, key, PLAN.job_spec(rule, key))
    return spec


def target_dir(wildcards, input):
    return os.path.dirname(input.target)

