"""The planner (specdec.plan) on the real configs, without Snakemake: which jobs each config
plans on each host class, and the config errors it raises. The integration tests check that the
DAG Snakemake builds from it is the one these tests describe (test_workflow.py)."""

import argparse
import copy
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from specdec import cli, plan
from specdec.plan import ConfigError, Plan

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config.yaml"
SWEEPS = yaml.safe_load((ROOT / "workflow" / "configs" / "sweeps.yaml").read_text())
LLAMACPP = yaml.safe_load((ROOT / "workflow" / "configs" / "llamacpp.yaml").read_text())
HEADLINE = ["ngram/k5", "suffix/d8", "null_drafter/k1", "null_drafter/k5", "medusa/len4_top3_nodes10",
            "mtp/steps1", "draft_model/len3", "pard/len3", "eagle3/ttt5_tree10"]
VLLM_HELDOUT = ["vllm:ngram/k5", "vllm:suffix/d8", "vllm:medusa/len4_top3_nodes10", "vllm:mtp/steps1",
                "vllm:draft_model/len3", "vllm:pard/len3", "vllm:eagle3/ttt5_chain2", "vllm_specdec:null_drafter/k5"]


def raw_config() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def test_the_default_config_plans_its_jobs():
    """The embedded default on a bf16-native host: three PyTorch jobs (each every method of a set
    against one baseline), three vLLM jobs (wiki, held-out, the float32 lossless check), five
    checkpoints and their exports."""
    jobs = plan.load(CONFIG, host_class="bfloat16").jobs()
    assert jobs["bench_torch"] == {
        "auto/chat_heldout": ["vllm_generate/greedy", *HEADLINE],   # our baseline loop against vLLM's, paired
        "auto/wiki": ["ngram/k5", "suffix/d8", "null_drafter/k1"],
        "float32/chat_overlap": ["ngram/k5", "suffix/d8", "medusa/len4_top3_nodes10", "mtp/steps1",
                                 "draft_model/len3", "pard/len3", "eagle3/ttt5_tree10", "eagle3/ttt5_chain2"]}
    assert jobs["bench_vllm"] == {
        "wiki": ["vllm:ngram/k5", "vllm:suffix/d8", "vllm_specdec:ngram/k5", "vllm_specdec:suffix/d8",
                 "vllm_specdec:null_drafter/k1"],
        "chat_heldout": VLLM_HELDOUT,
        plan.LOSSLESS_JOB: VLLM_HELDOUT}
    ckpts = ["draft_model/layers4", "eagle3/ttt5", "medusa/heads4", "mtp/modules1", "pard/layers4"]
    assert jobs["train"] == [f"checkpoints/{c}" for c in ckpts]
    assert jobs["export_vllm"] == [f"checkpoints/vllm_exports/{c.replace('/', '-')}" for c in ckpts]


def test_sizing_per_host_class():
    """sizing.float32 halves the work on an AVX2-only host (fewer prompts, shorter training, two
    batched vLLM rounds) and the tables say so; a bf16-native host runs the config as written."""
    bf16, fp32 = plan.load(CONFIG, host_class="bfloat16"), plan.load(CONFIG, host_class="float32")
    assert bf16.bench_setting("chat_heldout", "auto", "prompts") == 32
    assert fp32.bench_setting("chat_heldout", "auto", "prompts") == 16
    assert fp32.bench_setting("chat_heldout", "auto", "prompts", "vllm") == 4
    assert fp32.config["train"]["checkpoints"]["eagle3"]["ttt5"]["train"]["steps"] == 250
    assert fp32.vllm_engine("chat_heldout")["modes"]["batched"]["rounds"] == 2
    assert bf16.vllm_engine("chat_heldout")["modes"]["batched"]["rounds"] == 3
    assert bf16.sizing_note() == "the config as written (host class bfloat16; no sizing.bfloat16 in the config)"
    assert fp32.sizing_note().startswith("host class float32: config sizing.float32 replaces ")
    # a later layer (--config) that sets a sized value again wins, and no longer counts as sized
    layered = plan.load(CONFIG, {"bench": {"datasets": {"chat_heldout": {"prompts": 20}}}}, host_class="float32")
    assert layered.bench_setting("chat_heldout", "auto", "prompts") == 20
    n = lambda p: int(p.sizing_note().split("replaces ")[1].split()[0])  # noqa: E731
    assert n(layered) == n(fp32) - 1


def test_a_float32_host_runs_a_sets_float32_arms_in_its_auto_job():
    """Where auto is float32, a set timed in both dtypes runs once, in its auto job, which must
    stop on a host where auto is not float32 (require_float32); a bf16 host keeps two jobs."""
    c = raw_config()
    merge = {"bench": {"datasets": {"chat_overlap": {"dtypes": ["auto", "float32"]}}},
             "methods": {"ngram": {"dtypes": {"chat_overlap": ["auto", "float32"]}}}}
    fp32 = plan.load(CONFIG, merge, host_class="float32")
    bf16 = plan.load(CONFIG, merge, host_class="bfloat16")
    assert "float32/chat_overlap" not in fp32.jobs()["bench_torch"]
    assert "ngram/k5" in fp32.jobs()["bench_torch"]["auto/chat_overlap"]
    assert fp32.require_float32("auto", "chat_overlap") and not fp32.require_float32("auto", "wiki")
    assert {"auto/chat_overlap", "float32/chat_overlap"} <= set(bf16.jobs()["bench_torch"])
    assert not bf16.require_float32("auto", "chat_overlap")
    assert c == raw_config()   # load() reads the file; nothing here changed it


def test_the_sweeps_config_adds_its_rows():
    jobs = plan.load(CONFIG, SWEEPS, host_class="bfloat16").jobs()
    torch = jobs["bench_torch"]
    assert len(torch) > 3 and set(plan.load(CONFIG, host_class="bfloat16").jobs()["bench_torch"]) < set(torch)
    arms = {a for job in torch.values() for a in job}
    assert {m.split("/")[0] for m in arms} >= {"hf_generate", "hf_prompt_lookup", "hf_assisted"}
    assert len(jobs["bench_vllm"]) > 3


def test_the_llamacpp_config_adds_its_peers_to_the_heldout_job_with_the_build_as_input():
    """The opt-in llama.cpp peers join the held-out job; the job lists the build's manifest as an
    input and each peer arm gets the build directory; no other job changes."""
    default = plan.load(CONFIG, host_class="bfloat16")
    p = plan.load(CONFIG, LLAMACPP, host_class="bfloat16")
    torch = p.jobs()["bench_torch"]
    assert torch["auto/chat_heldout"][-2:] == ["llamacpp_generate/greedy", "llamacpp_lookup/k5"]
    assert {k: v for k, v in torch.items() if k != "auto/chat_heldout"} == \
        {k: v for k, v in default.jobs()["bench_torch"].items() if k != "auto/chat_heldout"}
    assert p.torch_job_tools("auto", "chat_heldout") == ["data/llama.cpp/manifest.json"]
    assert p.torch_job_tools("auto", "wiki") == [] == default.torch_job_tools("auto", "chat_heldout")
    arms = {a["method"]: a for a in p.torch_job_arms("auto", "chat_heldout")}
    assert arms["llamacpp_generate"]["params"] == {"build": "data/llama.cpp"}
    assert arms["llamacpp_lookup"]["compare_with"] == "ngram/k5"
    assert arms["llamacpp_lookup"]["params"]["spec_type"] == "ngram-simple"
    assert p.rule_spec("llamacpp_build")["threads"] == "all"


def test_the_full_scale_config_runs_one_vllm_job_per_arm():
    p = plan.load(ROOT / "workflow" / "configs" / "full-scale.yaml", host_class="bfloat16")
    jobs = p.jobs()["bench_vllm"]
    assert jobs and all(len(arms) == 1 for arms in jobs.values())
    assert "vllm-eagle3-" + next(j for j in jobs if j.startswith("vllm-eagle3-")).split("vllm-eagle3-")[1] in jobs
    for job in jobs:
        rows = p.vllm_rows(job)
        assert rows and all(r["prompts"] in plan.DATASET_FILES.values() for r in rows)
        assert p.vllm_job_prompts(job) == sorted({r["prompts"] for r in rows})


def test_spec_files_are_named_by_their_content_and_never_rewritten(tmp_path):
    """A job's spec file is written once, named by its content: the same spec gives the same file,
    left untouched (its job stays up to date); a changed spec gives a new file (its job is stale);
    and writing another plan's spec, as a dry run of another config does, leaves the first file
    as it was."""
    import os

    spec = {"arms": [{"method": "ngram", "variant": "k5", "params": {"draft_len": 5}}]}
    first = plan.spec_file("bench_torch", "auto/wiki", spec, root=tmp_path)
    assert first.startswith(f"{tmp_path}/results/specs/bench_torch/auto/wiki.") and first.endswith(".json")
    assert json.loads(open(first).read()) == spec
    os.utime(first, (1, 1))                    # as old as a finished job's inputs
    assert plan.spec_file("bench_torch", "auto/wiki", json.loads(json.dumps(spec)), root=tmp_path) == first
    assert os.stat(first).st_mtime == 1        # not rewritten
    other = plan.spec_file("bench_torch", "auto/wiki", {"arms": []}, root=tmp_path)
    assert other != first and os.stat(first).st_mtime == 1 and json.loads(open(first).read()) == spec
    assert plan.spec_file("cost_curve", "", {"sets": {}}, root=tmp_path).startswith(
        f"{tmp_path}/results/specs/cost_curve/cost_curve.")
    assert not list(tmp_path.rglob(".*.json.*"))   # no temporary file left behind


def test_jobs_read_their_structured_parameters_from_a_spec_file(tmp_path):
    """No JSON crosses a shell: a job's arms, rows and settings are the spec the planner writes
    (as Snakemake builds the DAG: workflow/rules/common.smk), each field an option of the job's
    verb, which reads it with --spec; a bad spec is an error naming the file and the field."""
    p = plan.load(CONFIG, host_class="bfloat16")
    verbs = {"bench_torch": "bench-torch", "ablation_bench": "bench-torch", "tune_torch": "tune-torch",
             "cost_curve": "cost-curve", "ablation": "ablation", "train_proposer": "train", "bench_vllm": "bench-vllm"}
    subparsers = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    held_out = "auto/chat_heldout"
    keys = {"bench_torch": held_out, "ablation_bench": held_out, "tune_torch": held_out, "cost_curve": "",
            "ablation": "", "train_proposer": "eagle3/ttt5", "bench_vllm": plan.LOSSLESS_JOB}
    for rule, verb in verbs.items():
        spec = p.job_spec(rule, keys[rule])
        assert spec and set(spec) <= set(subparsers.choices[verb].get_default("spec_fields")), rule
        assert json.loads(json.dumps(spec)) == spec
    assert p.job_spec("bench_torch", "auto/chat_heldout")["arms"] == p.torch_job_arms("auto", "chat_heldout")
    assert p.job_spec("train_proposer", "eagle3/ttt5")["settings"] == p.train_settings("eagle3", "ttt5")
    lossless = p.job_spec("bench_vllm", plan.LOSSLESS_JOB)
    assert lossless["modes"] == {"serial": {"max_num_seqs": 1, "warmup_prompts": 1}}
    with pytest.raises(ConfigError, match="no job spec for rule 'report'"):
        p.job_spec("report", "")
    # the verb reads the spec; the command line wins over it
    arms = p.job_spec("bench_torch", "auto/chat_heldout")["arms"]
    arms[0]["params"]["note"] = "it's a 'quoted' value; $HOME `x`"
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"arms": arms}))
    base = ["bench-torch", "--target", "t", "--prompts", "p.jsonl", "--dataset", "chat_heldout",
            "--max-new-tokens", "8", "--out-records", "r", "--out-summary", "s"]
    args = cli.build_parser().parse_args([*base, "--spec", str(path)])
    cli.apply_spec(args)
    assert args.arms == arms and args.sampling == {}
    args = cli.build_parser().parse_args([*base, "--spec", str(path), "--arms", "[]"])
    cli.apply_spec(args)
    assert args.arms == []
    for bad, error in [({"arm": arms}, "field 'arm' is not an option of specdec bench-torch"),
                       ({"arms": {}}, "field 'arms': expected a JSON list, got dict"),
                       ([arms], "expected a JSON object")]:
        path.write_text(json.dumps(bad))
        args = cli.build_parser().parse_args([*base, "--spec", str(path)])
        with pytest.raises(ValueError, match=re.escape(f"--spec {path}: ") + ".*" + re.escape(error)):
            cli.apply_spec(args)
    args = cli.build_parser().parse_args(base)
    with pytest.raises(ValueError, match="--arms is required"):
        cli.apply_spec(args)
    # the rules pass no JSON on a command line
    rules = "".join(f.read_text() for f in (ROOT / "workflow" / "rules").glob("*.smk"))
    assert "json.dumps" not in rules.replace("json.dumps(spec", "") and "'{params." not in rules.replace(
        "'{params.requirement}'", "")
    args = shlex.split(p.vllm_engine_args(plan.LOSSLESS_JOB))
    assert args[args.index("--dtype") + 1] == "float32" and "--aa-control" not in args
    assert "--role" in args and "--modes" not in args
    assert args[args.index("--async-scheduling") + 1] == "off"   # the default config: off in every engine
    assert args[args.index("--threads") + 1] == "0"   # in process: the engines compute on the job's threads
    on = plan.load(CONFIG, {"vllm": {"async_scheduling": True}}, host_class="bfloat16")
    assert "--async-scheduling on" in on.vllm_engine_args("chat_heldout")
    default = raw_config()
    del default["vllm"]["async_scheduling"]
    assert "--async-scheduling" not in Plan(default, "bfloat16").vllm_engine_args("chat_heldout")


def test_checkpoint_inputs_follow_the_config():
    """PARD starts from the trained draft model; a PyTorch job depends on the checkpoints its arms run."""
    p = plan.load(CONFIG, host_class="bfloat16")
    assert p.init_checkpoint("pard", "layers4") == ["checkpoints/draft_model/layers4/manifest.json"]
    settings = p.train_settings("pard", "layers4")
    assert settings["draft"]["init_model_path"] == "checkpoints/draft_model/layers4"
    assert "init_checkpoint" not in settings["draft"]
    assert p.torch_job_checkpoints("auto", "wiki") == []
    assert len(p.torch_job_checkpoints("auto", "chat_heldout")) == 5
    assert "methods/ngram.py" in " ".join(p.torch_job_sources("auto", "wiki"))


def test_the_learning_curve_and_ablation_add_their_checkpoints():
    p = plan.load(CONFIG, host_class="bfloat16")
    curve = p.learning_curve_checkpoints()
    assert curve[-1] == "checkpoints/eagle3/ttt5/manifest.json" and len(curve) >= 2
    for d in curve:
        method, name = d.split("/")[1:3]
        assert name in p.config["train"]["checkpoints"][method]
    rows = p.ablation_rows()
    assert {r["change"] for r in rows} >= {"baseline"}
    assert any(r["reference"] for r in rows) and p.checkpoint_hidden(
        next((r["method"], r["checkpoint"]) for r in rows if r["reference"])[0],
        next(r["checkpoint"] for r in rows if r["reference"])) == plan.ABLATION_HIDDEN
    assert p.checkpoint_hidden("eagle3", "ttt5") == plan.HIDDEN


def sized(mutate) -> dict:
    c = raw_config()
    mutate(c)
    return c


@pytest.mark.parametrize("mutate, message", [
    # a variant whose data sets and dtypes meet in no job
    (lambda c: c["methods"]["pard"]["variants"].update(
        len2={"checkpoint": "layers4", "draft_len": 2, "datasets": ["chat_overlap"], "dtypes": ["auto"]}),
     r"config: methods\.pard\.variants\.len2 runs in no job: it is configured on data sets \['chat_overlap'\] "
     r"in dtypes \['auto'\]"),
    (lambda c: c["methods"]["ngram"]["datasets"].append("nowhere"),
     r"config: methods\.ngram\.datasets: 'nowhere' is not in bench\.datasets"),
    (lambda c: c["vllm"]["datasets"].update(wiki=["ngram", "medusa/len9"]),
     r"config: vllm\.datasets\.wiki: 'medusa/len9' is not in methods"),
    (lambda c: c["vllm"]["datasets"].update(wiki=["null_drafter"]),
     r"config: vllm\.datasets\.wiki: vLLM has no 'null_drafter' of its own: list it under vllm\.specdec_proposers"),
    (lambda c: c["vllm"]["specdec_proposers"].update(wiki=["medusa"]),
     r"config: vllm\.specdec_proposers\.wiki: method 'medusa' cannot run inside vLLM's custom proposer hook"),
    (lambda c: c["vllm"]["lossless"].update(dataset="chat_overlap"),
     r"config: vllm\.lossless\.dataset 'chat_overlap': no vLLM arm runs on it"),
    (lambda c: c["train"]["learning_curve"].update(checkpoint="eagle3/missing"),
     r"config: train\.learning_curve\.checkpoint 'eagle3/missing' is not in train\.checkpoints"),
    # a tuning split that the prompt file cannot hold after the benchmarked prompts
    (lambda c: c["data"]["chat"].update(heldout_prompts=36),
     r"config: bench\.datasets\.chat_heldout\.tuning: 6 prompts after the 32 the benchmarks read need "
     r"data\.chat\.heldout_prompts >= 38, not 36"),
])
def test_a_config_that_plans_wrongly_is_an_error_naming_its_key(mutate, message):
    with pytest.raises(ConfigError, match=message):
        Plan(sized(mutate), "bfloat16")


def test_tuning_reads_only_records_no_benchmark_reads():
    """The tuning split of a set starts after every record that its PyTorch, vLLM, lossless and
    ablation jobs read from the same file (the sampled set draws on the held-out file too); its
    arms are the job's own-dtype variants with a tuning grid: no control, no MTP of one module."""
    for host, skip in (("bfloat16", 32), ("float32", 16)):
        p = plan.load(CONFIG, host_class=host)
        assert p.tuning_skip("chat_heldout") == skip
        assert [f"{a['method']}/{a['variant']}" for a in p.tuning_arms("auto", "chat_heldout")] == [
            "ngram/k5", "suffix/d8", "medusa/len4_top3_nodes10", "draft_model/len3", "pard/len3", "eagle3/ttt5_tree10"]
        assert p.torch_job_tuning("auto", "chat_heldout") == ["results/tuning/auto/chat_heldout.json"]
        assert p.torch_job_tuning("auto", "wiki") == [] and p.tuning_arms("auto", "wiki") == []
    c = raw_config()
    c["bench"]["datasets"]["chat_heldout_t07"]["vllm"]["prompts"] = 35
    c["data"]["chat"]["heldout_prompts"] = 43
    assert Plan(c, "bfloat16").tuning_skip("chat_heldout") == 35


def test_plan_changes_only_the_checkpoints_it_derives():
    """Planning adds the learning curve's and ablation's checkpoints to train.checkpoints and
    changes nothing else in the config."""
    c = raw_config()
    before = copy.deepcopy(c)
    Plan(c, "bfloat16")
    added = {m: set(c["train"]["checkpoints"][m]) - set(before["train"]["checkpoints"][m])
             for m in c["train"]["checkpoints"]}
    assert any(added.values()) and all(n.split("_")[-1].startswith(("records", "ablation"))
                                       for names in added.values() for n in names)
    c["train"]["checkpoints"] = before["train"]["checkpoints"]
    assert c == before
