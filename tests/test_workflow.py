"""The real Snakemake DAG on the smoke config (real SmolLM2 target, tiny sizes), the stale-rerun
property, config validation and the linter."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dag import (
    REPO,
    SMOKE,
    SMOKE_FIXED_ROWS,
    TIMED,
    benchmarks_ran_alone,
    copy_workflow,
    dry_run_jobs,
    edit,
    job_counts,
    job_specs,
    smk,
    smoke_row_count,
    spec_of,
)
from specdec.methods import PEERS


def test_lint_is_clean():
    proc = smk(REPO, "--lint", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_is_clean():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", str(REPO)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_config_typo_is_rejected_before_anything_runs(tmp_path):
    import yaml
    wd = copy_workflow(tmp_path)
    smoke = yaml.safe_load((REPO / "workflow" / "configs" / "smoke.yaml").read_text())
    for change, word in [(lambda c: c["bench"].update(warmup_prompts="one"), "warmup_prompts"),
                       (lambda c: c["methods"]["ngram"].update(varients={}), "varients"),
                       (lambda c: c["data"]["chat"].pop("completion_tokens"), "completion_tokens"),
                       (lambda c: c["train"]["checkpoints"]["medusa"]["heads2"]["train"].update(stpes=3), "stpes"),
                       (lambda c: c["methods"]["mtp"]["variants"]["steps2"].update(checkpoint="nope"),
                        "checkpoint 'nope' is not in train.checkpoints.mtp"),
                       (lambda c: c["train"]["checkpoints"]["pard"]["layers1"]["pard"].pop("pard_token"), "pard_token"),
                       (lambda c: c["methods"]["pard"]["variants"]["len3"].update(datasets=["chats"]), "chats"),
                       # a method's parameters and settings, against its module's dataclasses
                       (lambda c: c["methods"]["ngram"]["variants"]["k5"].update(draft_length=3), "draft_length"),
                       (lambda c: c["train"]["checkpoints"]["mtp"]["modules2"]["mtp"].update(modules=2), "modules"),
                       (lambda c: c["vllm"].update(specdec_proposers={"wiki": ["medusa"]}),
                        "cannot run inside vLLM's custom proposer hook")]:
        cfg = json.loads(json.dumps(smoke))
        change(cfg)
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump(cfg))
        proc = smk(wd, "-n", "--cores", "1", "--configfile", str(bad), check=False)
        assert proc.returncode != 0 and word in proc.stdout + proc.stderr, word


def test_sweeps_merge_into_the_default_and_every_row_is_paired(tmp_path):
    """The opt-in sweeps config adds its variants' rows and checkpoints to the default's; no job
    times a baseline alone (every speedup comes from a method's own job)."""
    wd = copy_workflow(tmp_path)
    sweeps = ("--configfile", "config.yaml", "workflow/configs/sweeps.yaml")

    def arms(specs):
        return {f"{a['method']}/{a['variant']}": a for spec in specs.values() for a in spec.get("arms", [])}

    # each dry run writes its jobs' specs; the sweeps' rewrite those of the default's jobs they change
    default = smk(wd, "-n", "-p", "--cores", "1", "results/tables.md").stdout
    default_arms = arms(job_specs(wd, default))
    both = smk(wd, "-n", "-p", "--cores", "1", *sweeps, "--", "results/tables.md").stdout
    both_arms = arms(job_specs(wd, both))
    for arm in ("pard/len2", "pard/len6", "medusa/len4_top5_nodes31", "mtp/steps2", "eagle3/ttt6_tree10",
                "hf_prompt_lookup/k5", "hf_assisted/len3"):
        assert arm in both_arms and arm not in default_arms, arm
    assert "checkpoints/eagle3/ttt6/manifest.json" in both and "checkpoints/eagle3/ttt6/" not in default
    # the HF peers run in the job of the arm of ours they are compared with
    assert {"ngram/k5", "draft_model/len3"} <= {a.get("compare_with") for a in both_arms.values()}
    assert "results/torch/auto/chat_heldout.summary.json" in default
    assert not any(arm.startswith("baseline/") for arm in default_arms | both_arms)
    assert "baseline.summary.json" not in default + both


def test_the_default_runs_the_null_drafter_and_a_a_arms(tmp_path):
    """The negative controls are part of the default: the null drafter's arms (1 draft token; and
    5, the longest headline chain, on the held-out set) and a second baseline arm in the held-out
    and wiki PyTorch jobs, and the null drafter inside vLLM on both sets, beside the methods' rows."""
    wd = copy_workflow(tmp_path)
    out = smk(wd, "-n", "-p", "--cores", "1", "results/tables.md").stdout
    specs = job_specs(wd, out)

    def bench_torch(dataset):
        return next(line for line in out.splitlines()
                    if "specdec bench-torch" in line and f"--dataset {dataset} " in line)

    def arms(command):
        return {(a["method"], a["variant"]) for a in spec_of(command, specs)["arms"]}

    for dataset in ("chat_heldout", "wiki"):
        job = bench_torch(dataset)
        assert ("null_drafter", "k1") in arms(job)
        assert (("null_drafter", "k5") in arms(job)) == (dataset == "chat_heldout")
        assert "--aa-control" in job and ("ngram", "k5") in arms(job)
    overlap = bench_torch("chat_overlap")
    assert "--aa-control" not in overlap and "null_drafter" not in {m for m, _ in arms(overlap)}
    # the held-out job times its tuned variants, chosen by a tuning job that drafts no control
    assert "--tuned results/tuning/auto/chat_heldout.json" in bench_torch("chat_heldout")
    assert "--tuned" not in bench_torch("wiki") + overlap
    tune = next(line for line in out.splitlines() if "specdec tune-torch" in line)
    # after the 32 held-out prompts the benchmarks read (16 where the host class halves them)
    assert "--dataset chat_heldout " in tune and "null_drafter" not in {m for m, _ in arms(tune)}
    assert re.search(r"--skip 32 --limit 6 |--skip 16 --limit 4 ", tune)
    for prompts, variant in (("chat_heldout", "k5"), ("wiki", "k1")):
        vllm = out.split(f"results/vllm/{prompts}.jsonl")[1]
        nulls = [(a["method"], a["variant"], a["proposer"]) for a in spec_of(vllm, specs)["arms"]
                 if a["method"] == "null_drafter"]
        assert nulls == [("null_drafter", variant, "specdec")]


def test_vllm_jobs_hold_a_prompt_set_or_one_arm(tmp_path):
    """By default one vLLM job per prompt set (every arm there against one baseline engine);
    vllm.jobs "arm" gives each arm its own job and baseline engine, over all its data sets."""
    wd = copy_workflow(tmp_path)
    jobs = re.compile(r"output: results/vllm/(\S+?)\.jsonl")
    default = smk(wd, "-n", "-p", "--cores", "1", "results/tables.md").stdout
    specs = job_specs(wd, default)
    assert sorted(jobs.findall(default)) == ["chat_heldout", "float32-lossless", "wiki"]
    # vllm.lossless: every arm of the held-out set again, float32, serial, no A/A engine
    lossless = default.split("results/vllm/float32-lossless.jsonl")[1].split("rule ")[0]
    check = spec_of(lossless, specs)
    assert re.search(r"--dtype (\S+)", lossless).group(1) == "float32" and list(check["modes"]) == ["serial"]
    assert "--in-process" in lossless and "--aa-control" not in lossless
    assert [(r["mode"], r["dataset"], r["limit"], r["max_new_tokens"]) for r in check["rows"]] == [
        ("serial", "chat_heldout", 4, 32)]
    assert len(check["arms"]) == 8
    chat = spec_of(default.split("results/vllm/chat_heldout.jsonl")[1], specs)
    arms, rows = chat["arms"], chat["rows"]
    assert [a["method"] for a in arms] == ["ngram", "suffix", "medusa", "mtp", "draft_model", "pard", "eagle3",
                                           "null_drafter"]
    assert all(a["datasets"] == ["chat_heldout", "chat_heldout_t07"] and a["proposer"] == "vllm" for a in arms[:-1])
    assert arms[-1]["datasets"] == ["chat_heldout"] and arms[-1]["proposer"] == "specdec"   # the control, ours
    assert [(r["mode"], r["dataset"]) for r in rows] == [
        ("serial", "chat_heldout"), ("batched", "chat_heldout"), ("batched", "chat_heldout_t07")]
    (wd / "arm.yaml").write_text("vllm: {jobs: arm}\n")
    per_arm = smk(wd, "-n", "--cores", "1", "--configfile", "config.yaml", "arm.yaml", "--", "results/tables.md").stdout
    assert sorted(jobs.findall(per_arm)) == sorted(
        [f"vllm-{m}" for m in ("ngram-k5", "suffix-d8", "medusa-len4_top3_nodes10", "mtp-steps1",
                               "draft_model-len3", "pard-len3", "eagle3-ttt5_chain2")]
        + ["vllm_specdec-ngram-k5", "vllm_specdec-suffix-d8", "vllm_specdec-null_drafter-k1",
           "vllm_specdec-null_drafter-k5"]
        # the lossless check per arm: each arm that runs on the held-out set
        + [f"float32-lossless-vllm-{m}" for m in ("ngram-k5", "suffix-d8", "medusa-len4_top3_nodes10", "mtp-steps1",
                                                  "draft_model-len3", "pard-len3", "eagle3-ttt5_chain2")]
        + ["float32-lossless-vllm_specdec-null_drafter-k5"])


def test_the_ablation_undoes_each_change_in_order(tmp_path):
    """docs/ablation.md (train.ablation): row k's checkpoint carries the `before` settings of every
    change after k (the earliest one winning), the rows before on-policy data train on the
    reference replies' cache, rows with equal settings share a checkpoint, and the last row is the
    configured checkpoint. The decoding job runs each checkpoint once."""
    wd = copy_workflow(tmp_path)
    # the config as written (a float32-class host's sizing halves the training steps)
    sized = ("--config", "sizing={host: bfloat16}")
    out = smk(wd, "-n", "-p", "--cores", "1", *sized, "--", "docs/ablation.md").stdout
    specs = job_specs(wd, out)
    train = re.compile(r"specdec train --method (\w+) --hidden (\S+) .*?--spec (\S+) "
                       r".*?--out-dir checkpoints/\w+/(\S+)")
    trains = {m.group(4): (m.group(1), m.group(2), specs[m.group(3)]["settings"]) for m in train.finditer(out)}
    assert sorted(trains) == ["heads4", "heads4_ablation0", "heads4_ablation1", "heads4_ablation2",
                              "heads4_ablation3", "ttt5", "ttt5_ablation0", "ttt5_ablation2", "ttt5_ablation3",
                              "ttt5_ablation4"]
    reference, on_policy = "data/ablation/hidden_reference.safetensors", "data/hidden/chat.safetensors"
    _, hidden, s = trains["heads4_ablation0"]
    assert hidden == reference and s["train"]["features"] == "post_norm"
    assert not s["train"]["soft_labels"] and s["train"]["steps"] == 500
    _, hidden, s = trains["heads4_ablation1"]
    assert hidden == reference and "features" not in s["train"] and not s["train"]["soft_labels"]
    assert trains["heads4_ablation2"][1] == on_policy and not trains["heads4_ablation2"][2]["train"]["soft_labels"]
    soft = trains["heads4_ablation3"][2]["train"]
    assert soft["soft_labels"] and soft["steps"] == 500
    assert trains["heads4"][2]["train"]["steps"] == 750 and trains["heads4"][1] == on_policy
    _, hidden, s = trains["ttt5_ablation0"]   # EAGLE-3 reads no tap the feature fix changed
    assert hidden == reference and s["eagle3"]["ttt_steps"] == 3 and s["eagle3"]["loss_decay"] == 1.0
    assert s["train"]["steps"] == 300 and not s["train"]["soft_labels"]
    passes = trains["ttt5_ablation4"][2]
    assert passes["eagle3"]["ttt_steps"] == 3 and passes["train"]["steps"] == 500
    assert trains["ttt5"][2]["eagle3"]["ttt_steps"] == 5
    rows = spec_of(out.split("specdec ablation ")[1], specs)["rows"]
    assert [(r["change"], r["checkpoint"]) for r in rows if r["method"] == "eagle3"] == [
        ("baseline", "ttt5_ablation0"), ("feature fix", "ttt5_ablation0"), ("on-policy data", "ttt5_ablation2"),
        ("soft labels", "ttt5_ablation3"), ("more passes", "ttt5_ablation4"), ("TTT depth", "ttt5")]
    assert [r["checkpoint"] for r in rows if r["method"] == "medusa"][-2:] == ["heads4", "heads4"]
    job = out.split("results/ablation/auto/chat_heldout.jsonl")[1]
    assert sorted(a["variant"] for a in spec_of(job, specs)["arms"]) == sorted(trains)


def test_a_variant_that_runs_in_no_job_is_a_config_error(tmp_path):
    """A variant whose data sets and dtypes meet in no job (here the sweeps' train-overlap PARD
    rows, which run in auto, with that set narrowed to float32) stops the plan, naming it."""
    wd = copy_workflow(tmp_path)
    (wd / "narrow.yaml").write_text("bench: {datasets: {chat_overlap: {dtypes: [float32]}}}\n")
    proc = smk(wd, "-n", "--cores", "1", "--configfile", "config.yaml", "workflow/configs/sweeps.yaml", "narrow.yaml",
               "--config", "sizing={host: bfloat16}", "--", "results/tables.md", check=False)
    assert proc.returncode != 0
    assert re.search(r"config: methods\.pard\.variants\.len2 runs in no job: it is configured on data "
                     r"sets \['chat_overlap'\] in dtypes \['auto'\]", proc.stderr + proc.stdout)


def test_the_default_is_sized_per_host_class(tmp_path):
    """config `sizing`: planned for a float32 host (no native bf16 matmuls), the default trains on
    half the records with half the steps and times half the prompts; for a bf16 host it runs as
    written. The report's tables say which."""
    wd = copy_workflow(tmp_path)

    def plan(*args):
        """A dry run's output, its specs, and EAGLE-3's checkpoint settings in them."""
        out = smk(wd, "-n", "-p", "--cores", "1", *args, "--", "results/tables.md").stdout
        specs = job_specs(wd, out)
        eagle3 = out.split("output: checkpoints/eagle3/ttt5/manifest.json", 1)[1].split("rule ", 1)[0]
        return out, specs, spec_of(eagle3, specs)["settings"]

    def heldout_limit(out):
        job = out.split("output: results/torch/auto/chat_heldout.jsonl", 1)[1].split("rule ", 1)[0]
        return int(re.search(r"--limit (\d+)", job).group(1))

    (bf16, _, bf16_eagle3), (fp32, _, fp32_eagle3) = (plan("--config", f"sizing={{host: {cls}}}")
                                                    for cls in ("bfloat16", "float32"))
    assert "--train-prompts 2500" in bf16 and "--train-prompts 1250" in fp32
    assert heldout_limit(bf16) == 32 and heldout_limit(fp32) == 16
    assert (bf16_eagle3["train"]["steps"], fp32_eagle3["train"]["steps"]) == (500, 250)
    assert "--sizing 'the config as written (host class bfloat16" in bf16
    assert "--sizing 'host class float32: config sizing.float32 replaces" in fp32
    jobs = re.compile(r"output: results/torch/(\S+?)\.jsonl")
    assert sorted(jobs.findall(bf16)) == sorted(jobs.findall(fp32)) == [
        "auto/chat_heldout", "auto/wiki", "float32/chat_overlap"]
    assert "--require-dtype" not in bf16 + fp32
    # where auto is float32, a set timed in both dtypes (the sweeps' train-overlap set) runs one
    # job: its float32 arms (the lossless checks, hf_generate's, EAGLE-3's chain) join its auto
    # job, which stops where auto is not float32
    sweeps, specs, _ = plan("--configfile", "config.yaml", "workflow/configs/sweeps.yaml",
                            "--config", "sizing={host: float32}")
    assert "float32/chat_overlap" not in jobs.findall(sweeps) and "auto/chat_overlap" in jobs.findall(sweeps)
    overlap = sweeps.split("output: results/torch/auto/chat_overlap.jsonl", 1)[1].split("rule ", 1)[0]
    arms = {(a["method"], a["variant"]) for a in spec_of(overlap, specs)["arms"]}
    assert ("eagle3", "ttt5_chain2") in arms and "hf_generate" in {m for m, _ in arms}
    assert sweeps.count("--require-dtype float32") == overlap.count("--require-dtype float32") == 1
    # what is layered on the config file (a later --configfile, --config) beats the sizing
    (wd / "more.yaml").write_text("data: {chat: {train_prompts: 1500}}\n")
    layered, _, layered_eagle3 = plan("--configfile", "config.yaml", "more.yaml", "--config", "sizing={host: float32}")
    assert "--train-prompts 1500" in layered and layered_eagle3["train"]["steps"] == 250
    replaced = re.compile(r"sizing.float32 replaces (\d+) of its values")
    assert int(replaced.search(layered).group(1)) == int(replaced.search(fp32).group(1)) - 1
    # the opt-in longer EAGLE-3 training merges into the checkpoint's settings, the rest kept
    # (on a float32 host too: layered on the config, it beats sizing.float32's 250 steps)
    for cls, prompts in (("bfloat16", 2500), ("float32", 1250)):
        long, _, settings = plan("--configfile", "config.yaml", "workflow/configs/eagle3-long.yaml",
                                 "--config", f"sizing={{host: {cls}}}")
        train = settings["train"]
        assert train["steps"] == 1000 and train["batch_size"] == 8 and train["soft_labels"]
        assert settings["eagle3"]["ttt_steps"] == 5 and f"--train-prompts {prompts}" in long


def torch_rows(wd: Path, dtype: str | None = None) -> list[dict]:
    """Every row of the PyTorch jobs' summaries (results/torch/<dtype>/<data set>.summary.json)."""
    return [row for p in sorted((wd / "results" / "torch").glob(f"{dtype or '*'}/*.summary.json"))
            for row in json.loads(p.read_text())["rows"]]


def torch_row(wd: Path, dtype: str, dataset: str, label: str) -> dict:
    job = json.loads((wd / "results" / "torch" / dtype / f"{dataset}.summary.json").read_text())
    rows = [r for r in job["rows"] if r["method"] == label]
    assert len(rows) == 1, (dtype, dataset, label, [r["method"] for r in job["rows"]])
    return rows[0]


def vllm_job(wd: Path, prompts: str) -> list[dict]:
    """The rows of the vLLM job on one prompt set (results/vllm/<prompt set>.summary.json)."""
    return json.loads((wd / "results" / "vllm" / f"{prompts}.summary.json").read_text())["rows"]


def vllm_row(wd: Path, label: str, mode: str, dataset: str, proposer: str = "vllm") -> dict:
    """One vLLM row: method/variant in one mode on one data set, drafted by vLLM's proposer or ours."""
    rows = [r for p in sorted((wd / "results" / "vllm").glob("*.summary.json"))
            for r in json.loads(p.read_text())["rows"]
            if (r["method"], r["settings"]["mode"], r["dataset"], r["settings"]["proposer"]) ==
            (label, mode, dataset, proposer)]
    assert len(rows) == 1, (label, mode, dataset, proposer, len(rows))
    return rows[0]


@pytest.mark.integration
def test_a_benchmark_job_never_shares_the_machine(smoke_run):
    """Under --cores 2 a benchmark job (it claims every core) starts only when nothing runs, and
    nothing starts while it runs; other jobs did run side by side. (Through SLURM, sacct shows
    the same: tests/test_slurm.py; the full-scale-shaped run checks the local executor.)"""
    if (smoke_run / "slurm-runs.json").exists():
        pytest.skip("the smoke DAG ran through SLURM: tests/test_slurm.py checks this from sacct")
    benchmarks, most = benchmarks_ran_alone((smoke_run / "smoke.log").read_text())
    # 5 PyTorch jobs, 3 vLLM jobs (53 rows and the tuned ones), the cost curve, 2 tunings (wiki)
    assert benchmarks == 11 and most == 2


# Debian's chromium, headless, on a machine whose network is closed (no background connections)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.mark.integration
def test_report_shows_its_plots_and_tables_in_headless_chromium(smoke_run, tmp_path):
    """`snakemake --report` opened in Debian's headless Chromium (through Playwright): the Results
    category opens the speedup plot, the Tables category the rows table, and both render
    (screenshots: report-*.png in the test's temp dir)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the test extra installs playwright")
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it: apt-get install chromium)")
    html = tmp_path / "report.html"
    smk(smoke_run, "--report", str(html), "--cores", "1", *SMOKE)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(html.as_uri())

        def open_result(category: str, label: str):
            # a category with one subcategory opens its table of results; a row's first link
            # (the eye) shows the result
            page.locator("nav a", has_text=re.compile(f"^{category}$")).click()
            cell = page.locator("td", has_text=re.compile(f"^{re.escape(label)}$"))
            page.locator("tr").filter(has=cell).locator("a").first.click()

        open_result("Results", "speedup")
        plot = page.locator("img[src^='data:image/png']")
        plot.first.wait_for()
        assert plot.count() == 1 and plot.evaluate("img => img.naturalWidth") > 300
        page.screenshot(path=str(tmp_path / "report-speedup.png"))
        page.goto(html.as_uri())
        open_result("Tables", "every row")
        frame = page.frame_locator("iframe")
        frame.locator("tbody tr").first.wait_for()
        assert frame.locator("th", has_text=re.compile("^speedup$")).count() == 1
        # every row of the results, whatever number of tuned variants the tuning added
        rows = pd.read_parquet(smoke_run / "results" / "rows.parquet")
        assert frame.locator("tbody tr").count() == len(rows) >= SMOKE_FIXED_ROWS
        page.screenshot(path=str(tmp_path / "report-rows.png"))
        browser.close()


def test_slurm_profile_requests_what_each_rule_needs():
    """A dry run of the full-scale config through the SLURM profile: every job states its
    partition and account (from the environment), cores, memory, runtime and, where it needs one,
    its GPU."""
    proc = smk(REPO, "-n", "--forceall", "results/tables.md", "--profile", "workflow/profiles/slurm",
               "--configfile", "workflow/configs/full-scale.yaml",
               env={"SPECDEC_SLURM_PARTITION": "gpu-a100", "SPECDEC_SLURM_ACCOUNT": "lab42"})
    requests = {job["rule"]: job["resources"] for job in dry_run_jobs(proc.stdout + proc.stderr)}
    # the timed jobs claim a whole node's worth of cores (the profile's set-threads)
    assert {int(requests[r]["cpus_per_task"]) for r in TIMED} == {16}
    for rule, gpu in (("train_proposer", True), ("export_vllm", False), ("bench_vllm", True)):
        req = requests[rule]
        assert int(req["cpus_per_task"]) >= 4 and int(req["mem_mb"]) >= 32000 and int(req["runtime"]) >= 60, req
        assert (req.get("gpu") == "1" and req.get("gpu_manufacturer") == "nvidia") == gpu, req
        assert (req["slurm_partition"], req["slurm_account"]) == ("gpu-a100", "lab42"), req
    assert set(requests) >= {"target_model", "chat_set", "hidden_states", "bench_torch", "report"}


@pytest.mark.integration
def test_smoke_dag_end_to_end(smoke_run):
    wd = smoke_run
    tables = (wd / "results" / "tables.md").read_text()
    for name in ("ngram/k5", "suffix/d8", "hf_generate/greedy", "vllm_generate/greedy", "hf_prompt_lookup/k5",
                 "medusa/len2_top2_nodes4", "mtp/steps2", "draft_model/len3", "pard/len3", "hf_assisted/len3",
                 "eagle3/chain2", "eagle3/tree3"):
        assert name in tables
    # learned proposers: trained through the DAG, with their log and eval proxy, listed in the tables
    for ckpt in ("medusa/heads2", "mtp/modules2", "draft_model/layers1", "pard/layers1", "eagle3/ttt2"):
        meta = "specdec.json" if ckpt.startswith(("draft", "pard")) else "config.json"
        cfg = json.loads((wd / "checkpoints" / ckpt / meta).read_text())
        assert len([r for r in cfg["train_log"] if "loss" in r]) == 3 and cfg["eval_proxy"]["heldout"]
        assert not (wd / "checkpoints" / ckpt / "resume.pt").exists()
        assert f"checkpoints/{ckpt}" in tables
    for png in ("speedup", "throughput", "acceptance_by_position"):
        assert (wd / "results" / "plots" / f"{png}.png").stat().st_size > 1000
    # lossless in fp32 on the real target: every method matches the baseline arm of its job, and
    # every speedup is paired, with its interval
    for s in torch_rows(wd, "float32"):
        summary = (s["dataset"], s["method"])
        if s["settings"]["sampling"]["temperature"] > 0:
            # sampled (chat_heldout_t07): no token-by-token check; both arms decode every token
            assert s["matches_baseline"] is None and s["token_count_mismatches"] == 0, summary
            assert s["new_tokens"] == s["prompts"] * s["settings"]["max_new_tokens"] and s["settings"]["ignore_eos"]
        else:
            assert s["matches_baseline"] == s["prompts"], (summary, s["diverged_prompts"])
        assert s["timing"] == "paired" and s["speedup_ci"][0] <= s["speedup"] <= s["speedup_ci"][1]
        assert s["throughput_tok_s"] > 0 and "isa" in s["environment"]["cpu"]
    rows = pd.read_parquet(wd / "results" / "rows.parquet")
    assert {"backend", "mode", "dataset", "dtype", "method", "variant", "speedup", "ci_low", "ci_high",
            "environment.cpu.native_bf16"} <= set(rows.columns)
    # one PyTorch job per (dtype, data set): every method there and one baseline arm
    assert sorted(p.relative_to(wd / "results" / "torch").as_posix()
                  for p in (wd / "results" / "torch").rglob("*.summary.json")) == [
        "auto/wiki.summary.json", "float32/chat_heldout.summary.json", "float32/chat_heldout_t07.summary.json",
        "float32/chat_overlap.summary.json", "float32/wiki.summary.json"]
    assert sorted(p.name for p in (wd / "results" / "vllm").glob("*.summary.json")) == [
        "chat_heldout.summary.json", "chat_overlap.summary.json", "wiki.summary.json"]   # one job per prompt set
    # the negative controls in both wiki jobs: a null drafter never accepted, an A/A arm
    for dtype in ("float32", "auto"):
        null, aa = torch_row(wd, dtype, "wiki", "null_drafter/k1"), torch_row(wd, dtype, "wiki", "baseline/aa")
        assert null["drafted_tokens"] > 0 and null["accepted_tokens"] == 0 and null["tau"] == 1.0
        assert aa["timing"] == "paired" and not aa["drafted_tokens"]
        assert null["settings"]["arms"][-1] == "baseline/aa"
    # tuned variants: n-gram and suffix in both wiki jobs, chosen on the third question (the two
    # the benchmarks read are not in the split); a choice other than the fixed variant is timed
    # beside it (and checked lossless above, in float32)
    tuned = 0
    for dtype in ("float32", "auto"):
        choices = json.loads((wd / "results" / "tuning" / dtype / "wiki.json").read_text())
        assert choices["prompts"]["skip"] == 2 and [c["fixed"] for c in choices["choices"]] == ["ngram/k5", "suffix/d8"]
        split = [json.loads(line)["id"] for line in
                 (wd / "results" / "tuning" / dtype / "wiki.candidates.jsonl").read_text().splitlines()]
        benchmarked = {r["id"] for r in map(json.loads, (wd / "results" / "torch" / dtype / "wiki.jsonl")
                                            .read_text().splitlines())}
        assert len(set(split)) == 1 and not set(split) & benchmarked
        for c in choices["choices"]:
            fixed = torch_row(wd, dtype, "wiki", c["fixed"])
            assert fixed["tuning"]["chosen"] == c["chosen"] and len(c["candidates"]) == 4
            if not c["same_as_fixed"]:
                row = torch_row(wd, dtype, "wiki", f"{c['method']}/{c['variant']}")
                assert row["settings"]["params"] == c["params"]
                tuned += 1
    assert "## Tuned variants" in tables
    assert len(rows) == SMOKE_FIXED_ROWS + tuned == smoke_row_count(wd) == len(torch_rows(wd)) + sum(
        len(vllm_job(wd, p)) for p in ("chat_heldout", "chat_overlap", "wiki"))
    # the cost curve at every PyTorch set's context; every PyTorch row of ours checked against its job's step costs
    curve = json.loads((wd / "results" / "costs" / "cost_curve.json").read_text())
    assert {(p["dtype"], p["dataset"]) for p in curve["points"]} >= {
        ("float32", ds) for ds in ("chat_heldout", "chat_overlap", "wiki", "chat_heldout_t07")}
    assert curve["memory_read_gb_s"] > 0 and "float32" in [f["dtype"] for f in curve["floors"]]
    # vLLM's plain decoding, a peer arm of our wiki jobs: our baseline against it, paired
    assert "- vLLM (offline engine, serial) (wiki, " in tables
    ours = rows[(rows["backend"] == "torch") & ~rows["method"].isin(list(PEERS))]
    assert ours["predicted_decode_speedup"].notna().all() and ours["cost_account"].notna().all()
    assert (ours["verify_reference"] == "job").all()      # the step costs timed in each row's own job
    assert "Decode speedup / predicted" in tables and (wd / "results" / "cost_curve.md").exists()
    assert all(r["environment"]["memory_read_gb_s"] > 0 for r in torch_rows(wd))
    # the Snakemake report: the plots and the rows table, with their captions
    smk(wd, "--report", "results/report.html", *SMOKE)
    html = (wd / "results" / "report.html").read_text()
    for name in ("speedup.png", "throughput.png", "acceptance_by_position.png", "rows.csv", "Paired speedup"):
        assert name in html, name
    # vllm-cpu, for real: serial and batched baseline engines and the n-gram method, same schema
    torch_keys = set(torch_row(wd, "float32", "wiki", "ngram/k5"))
    for mode in ("serial", "batched"):
        ngram = vllm_row(wd, "ngram/k5", mode, "wiki")
        assert "error" not in ngram, ngram.get("error")
        assert ngram["settings"]["in_process"]  # vllm.in_process
        # the schema of our rows, less the blocks only our loop's jobs write
        assert set(ngram) >= torch_keys - {"same_run", "tuning", "step_costs"} and ngram["prompts"] == 2
        # the baseline engine ran in the same job: a paired speedup, and its outputs as reference
        assert ngram["drafted_tokens"] > 0 and ngram["timing"] == "paired"
        assert ngram["speedup_ci"][0] <= ngram["speedup"] <= ngram["speedup_ci"][1]
        assert ngram["matches_baseline"] is not None
        # suffix decoding through vLLM: Arctic Inference's suffix tree
        suffix = vllm_row(wd, "suffix/d8", mode, "wiki")
        assert "error" not in suffix, suffix.get("error")
        assert suffix["drafted_tokens"] > 0 and suffix["settings"]["proposer"] == "vllm"
        # our own n-gram and suffix proposers inside vLLM, on the same prompts
        for name in ("ngram/k5", "suffix/d8"):
            ours = vllm_row(wd, name, mode, "wiki", proposer="specdec")
            assert "error" not in ours, ours.get("error")
            assert ours["settings"]["proposer"] == "specdec" and ours["drafted_tokens"] > 0
            assert ours["settings"]["speculative_config"]["method"] == "custom_class"
            assert ours["matches_baseline"] is not None and ours["prompts"] == 2
        # one job per prompt set: every arm there against one baseline engine, in a rotating order
        assert ngram["settings"]["arms"] == ["baseline", "baseline/aa", "ngram/k5", "suffix/d8", "ngram/k5 (specdec)",
                                             "suffix/d8 (specdec)", "null_drafter/k1 (specdec)"]
        # the null drafter inside vLLM: it drafts every step, and vLLM accepts none of it
        null = vllm_row(wd, "null_drafter/k1", mode, "wiki", proposer="specdec")
        assert "error" not in null, null.get("error")
        assert null["drafted_tokens"] > 0 and null["accepted_tokens"] == 0 and null["matches_baseline"] is not None
        assert ngram["settings"]["arm_order"].startswith("engine steps interleaved")   # in process
        # the A/A control: a second baseline engine, timed as an arm, decodes the same tokens
        aa = vllm_row(wd, "baseline/aa", mode, "wiki")
        assert aa["matches_baseline"] == aa["prompts"] == 2 and aa["drafted_tokens"] is None
        assert aa["speedup_ci"][0] <= aa["speedup"] <= aa["speedup_ci"][1]
        assert ngram["settings"]["row_arms"] == ngram["settings"]["arms"]
        assert ngram["settings"]["engine_max_num_seqs"] == 4
        assert ngram["settings"]["requests_in_flight"] == (1 if mode == "serial" else 2)
        assert "vLLM serial (1 request in flight)" in tables
        assert "vLLM serial (1 request in flight), our proposer" in tables
    # sampling through vLLM: the draft model at T = 0.7, batched, per-prompt seeds
    m = vllm_row(wd, "draft_model/len3", "batched", "chat_heldout_t07")
    assert "error" not in m, m.get("error")
    assert m["settings"]["sampling"]["temperature"] == 0.7 and m["drafted_tokens"] > 0 and m["matches_baseline"] is None
    # vllm-cpu's expand kernel, repaired for sampled verification (and its kernel rebinding, for
    # every engine started after an n-gram one)
    assert len(m["settings"]["vllm_repairs"]) == 2 and "expand_kernel" in m["settings"]["vllm_repairs"][1]
    # the held-out prompts' job: n-gram greedy, the draft model sampled; each arm only on its rows
    job = vllm_job(wd, "chat_heldout")
    assert [(r["method"], r["settings"]["mode"], r["dataset"]) for r in job] == [   # vllm_modes: [batched]
        ("baseline/aa", "serial", "chat_heldout"), ("ngram/k5", "serial", "chat_heldout"),
        ("baseline/aa", "batched", "chat_heldout"), ("ngram/k5", "batched", "chat_heldout"),
        ("baseline/aa", "batched", "chat_heldout_t07"), ("draft_model/len3", "batched", "chat_heldout_t07")]
    assert job[1]["settings"]["row_arms"] == ["baseline", "baseline/aa", "ngram/k5"]
    assert job[5]["settings"]["row_arms"] == ["baseline", "baseline/aa", "draft_model/len3"]
    # the job's first batched row warms on whole decodes, a later one on warmup_tokens per request
    first, later = (r["settings"] for r in job[3::2])
    assert first["warmup_tokens"] == first["max_new_tokens"]
    assert later["warmup_tokens"] == min(8, later["max_new_tokens"]) and later["warmup_prompts"] == 2
    assert "sampled at T = 0.7" in tables
    # the train-overlap job: every learned method against one baseline engine; greedy rows need no repair
    assert [r["method"] for r in vllm_job(wd, "chat_overlap")][:6] == [
        "baseline/aa", "medusa/len2_top2_nodes4", "mtp/steps2", "draft_model/len3", "pard/len3", "eagle3/chain2"]
    assert vllm_row(wd, "draft_model/len3", "serial", "chat_overlap")["settings"]["vllm_repairs"] == [
        "kernel rebinding skips objects whose __dict__ is not a dict (llvmlite's library wrapper)"]
    # MTP through vLLM, from the MiMo export: vLLM loads it as target + drafter and drafts with it
    assert (wd / "checkpoints/vllm_exports/mtp-modules2/manifest.json").exists()
    for mode in ("serial", "batched"):
        m = vllm_row(wd, "mtp/steps2", mode, "chat_overlap")
        assert "error" not in m, m.get("error")
        assert m["settings"]["model"].endswith("vllm_exports/mtp-modules2")
        assert m["drafted_tokens"] > 0 and m["prompts"] == 2
    # Medusa through vLLM, from its MedusaModel export (one token per head: a chain)
    for mode in ("serial", "batched"):
        m = vllm_row(wd, "medusa/len2_top2_nodes4", mode, "chat_overlap")
        assert "error" not in m, m.get("error")
        assert m["settings"]["speculative_config"]["method"] == "medusa" and m["draft_shape"] == "chain k=2"
        assert m["drafted_tokens"] > 0 and m["prompts"] == 2
    # the draft family through vLLM, from their exports (PARD with parallel drafting)
    for mode in ("serial", "batched"):
        for name in ("draft_model", "pard"):
            m = vllm_row(wd, f"{name}/len3", mode, "chat_overlap")
            assert "error" not in m, m.get("error")
            assert m["settings"]["speculative_config"]["model"].endswith(f"vllm_exports/{name}-layers1")
            assert m["settings"]["speculative_config"].get("parallel_drafting", False) == (name == "pard")
            assert m["drafted_tokens"] > 0 and m["prompts"] == 2
    # EAGLE-3 through vLLM, from its LlamaForCausalLMEagle3 export (chain mode)
    for mode in ("serial", "batched"):
        m = vllm_row(wd, "eagle3/chain2", mode, "chat_overlap")
        assert "error" not in m, m.get("error")
        assert m["settings"]["speculative_config"] == {
            "method": "eagle3", "model": m["settings"]["speculative_config"]["model"], "num_speculative_tokens": 2}
        assert m["settings"]["speculative_config"]["model"].endswith("vllm_exports/eagle3-ttt2")
        assert m["drafted_tokens"] > 0 and m["prompts"] == 2
    # the draft family: standalone Hugging Face drafts; PARD adapts the trained draft model
    pard_cfg = json.loads((wd / "checkpoints/pard/layers1/config.json").read_text())
    assert pard_cfg["pard_token"] == 16 and pard_cfg["vocab_size"] == 49152
    assert json.loads((wd / "checkpoints/pard/layers1/specdec.json").read_text())["config"]["draft"][
        "init_model_path"] == "checkpoints/draft_model/layers1"
    peer = torch_row(wd, "float32", "chat_overlap", "hf_assisted/len3")
    assert peer["same_run"]["counterpart"] == "draft_model/len3" and peer["same_run"]["same_outputs"] == 2
    recs = [json.loads(line) for line in (wd / "data" / "chat" / "train.jsonl").read_text().splitlines()]
    assert len(recs) == 6 and all(r["completion_ids"] for r in recs)
    # the train-overlap slice keeps greedy completions; the rest are ShareGPT replies, labelled by
    # the target's prefill (train_completions: reference)
    assert [r["completion_source"] for r in recs] == ["greedy"] * 2 + ["reference"] * 4
    # the learning curve: EAGLE-3 again on the first 3 records, the held-out proxy logged in training
    curve = json.loads((wd / "checkpoints/eagle3/ttt2_records3/config.json").read_text())
    assert curve["train"]["records"] == curve["train"]["train_records"] == 3
    assert [r["step"] for r in curve["train_log"] if "eval" in r] == [2]
    # its opt-in target, not part of results/tables.md
    assert "## Learning curve" in (wd / "results/learning_curve.md").read_text()
    assert (wd / "results/plots/learning_curve.png").stat().st_size > 0 and "Learning curve" not in tables
    assert not list(wd.rglob("*.tmp")) and not list(wd.rglob("*.partial"))


def package_relative(paths) -> set[str]:
    """Project source files as paths inside the package (src/specdec/...), wherever src/ lies."""
    return {("/" + p).split("/src/specdec/", 1)[1] for p in paths if "src/specdec/" in p and p.endswith(".py")}


@pytest.mark.integration
def test_every_job_loaded_only_its_code_inputs(smoke_run):
    """The code inputs each rule computes from the import graph (specdec.deps) hold every project
    file its job really loaded, on every job of the smoke DAG: an edit to any file a job ran
    makes that job stale. (The hand-kept lists this replaced missed core/sampling.py and
    core/loop.py in the vLLM jobs.)"""
    wd = smoke_run
    jobs = dry_run_jobs(smk(wd, "-n", "--forceall", "results/tables.md", "results/learning_curve.md",
                            "--cores", "1", *SMOKE).stdout)
    runs = [json.loads(line) for line in (wd / "modules.jsonl").read_text().splitlines()]
    assert len(runs) >= len(jobs) - 3   # fetch_wheel's download may be cached; every other job logs

    def owner(argv):
        """The planned job whose output the command writes (an output, or a directory above one)."""
        paths = [a.rstrip("/") for flag, a in zip(argv, argv[1:]) if flag.startswith("--out")]
        found = [j for j in jobs if any(o == a or o.startswith(a + "/") for o in j["output"] for a in paths)]
        assert found, f"no planned job writes what {argv} writes"
        return found[0]

    checked = set()
    for run in runs:
        job = owner(run["argv"])
        if job["rule"] == "fetch_wheel":
            continue   # a pinned download: no code inputs, so an edit never fetches again
        missing = package_relative(run["files"]) - package_relative(job["input"])
        assert not missing, f"{job['rule']} ({job['output'][0]}) loaded files not in its inputs: {sorted(missing)}"
        checked.add(job["rule"])
    assert {"bench_torch", "bench_vllm", "train_proposer", "export_vllm", "hidden_states", "report"} <= checked


@pytest.mark.integration
def test_a_moved_checkout_has_nothing_stale(smoke_run, tmp_path):
    """The finished smoke DAG, moved to another path (hard links: every file and time kept), is up
    to date there: the rules name their code inputs relative to the working directory
    (deps.as_inputs), and Snakemake reruns a job whose set of input names changed."""
    moved = tmp_path / "elsewhere"
    subprocess.run(["cp", "-al", str(smoke_run), str(moved)], check=True)
    out = smk(moved, "-n", "results/tables.md", "results/learning_curve.md", "--cores", "1", *SMOKE).stdout
    assert "Nothing to be done" in out, out[-3000:]


@pytest.mark.integration
@pytest.mark.parametrize("source", ["core/sampling.py", "core/loop.py", "methods/ngram.py",
                                    "backends/vllm_hook.py"])
def test_editing_a_source_reruns_every_job_that_loaded_it(smoke_run, source):
    """Touching (editing) one source file makes stale, through its own inputs, every job that
    loaded the file in the smoke run, and no job whose computed inputs lack it."""
    wd = smoke_run
    runs = [json.loads(line) for line in (wd / "modules.jsonl").read_text().splitlines()]
    loaded = [r["argv"] for r in runs if source in package_relative(r["files"])]
    assert loaded, f"no job of the smoke run loaded {source}"
    path = wd / "src" / "specdec" / source
    original = path.read_text()
    edit(path)
    try:
        out = smk(wd, "-n", "results/tables.md", "results/learning_curve.md", "--cores", "1", *SMOKE).stdout
    finally:
        path.write_text(original)
    stale = dry_run_jobs(out)
    direct = [j for j in stale if any(("/" + i).endswith("/src/specdec/" + source) for i in j["input"])]
    for argv in loaded:
        paths = [a.rstrip("/") for flag, a in zip(argv, argv[1:]) if flag.startswith("--out")]
        assert any(o == a or o.startswith(a + "/") for j in direct for o in j["output"] for a in paths), \
            f"editing {source} leaves stale the job of {argv}, which loaded it"
    # what else reruns does so downstream of a job whose inputs hold the file
    direct_outputs = {o for j in direct for o in j["output"]}
    for j in stale:
        if j not in direct:
            assert set(j["input"]) & direct_outputs or any(set(j["input"]) & set(k["output"]) for k in stale), j


@pytest.mark.integration
def test_editing_one_method_reruns_only_its_jobs(smoke_run):
    """A method's edit reruns its training and export, the PyTorch jobs of the (dtype, data set)
    pairs it runs on (each times every method there against one baseline) and the vLLM jobs of
    the prompt sets it runs on."""
    wd = smoke_run
    assert "Nothing to be done" in smk(wd, "-n", "results/tables.md", "--cores", "1", *SMOKE).stdout

    def torch_jobs(out):
        return sorted(re.findall(r"output: results/torch/(\S+?)\.jsonl", out))

    def vllm_jobs(out):
        return sorted(re.findall(r"output: results/vllm/(\S+?)\.jsonl", out))

    # a learned method: its training, its export and the jobs it runs in, nothing else
    medusa = wd / "src" / "specdec" / "methods" / "medusa.py"
    original = medusa.read_text()
    edit(medusa)
    out = smk(wd, "-n", "results/tables.md", "--cores", "1", *SMOKE).stdout
    assert job_counts(out) == {"train_proposer": 1, "bench_torch": 1, "export_vllm": 1, "bench_vllm": 1, "report": 1}
    assert "checkpoints/medusa/heads2/manifest.json" in out and torch_jobs(out) == ["float32/chat_overlap"]
    assert vllm_jobs(out) == ["chat_overlap"]
    medusa.write_text(original)  # same content again: Snakemake compares checksums, nothing is stale
    assert "Nothing to be done" in smk(wd, "-n", "results/tables.md", "--cores", "1", *SMOKE).stdout
    ngram = wd / "src" / "specdec" / "methods" / "ngram.py"
    original = ngram.read_text()
    edit(ngram)
    out = smk(wd, "-n", "results/tables.md", "--cores", "1", *SMOKE).stdout
    # ngram on 4 data sets (wiki in two dtypes, each tuned first), and its vLLM rows: vLLM's n-gram
    # and ours inside vLLM (its module holds its vLLM mapping), on the wiki and held-out prompts
    assert job_counts(out) == {"tune_torch": 2, "bench_torch": 5, "bench_vllm": 2, "report": 1}
    assert vllm_jobs(out) == ["chat_heldout", "wiki"]
    assert torch_jobs(out) == ["auto/wiki", "float32/chat_heldout", "float32/chat_heldout_t07",
                               "float32/chat_overlap", "float32/wiki"]
    ngram.write_text(original)
    # the draft LM code shared by the draft model and PARD: their training, exports and benchmarks
    # (PyTorch loop and vLLM; the assisted-generation peer loads the same draft), not Medusa's
    # or MTP's training or exports, and not the n-gram-only jobs
    edit(wd / "src" / "specdec" / "methods" / "draft_lm.py")
    out = smk(wd, "-n", "results/tables.md", "--cores", "1", *SMOKE).stdout
    assert job_counts(out) == {"train_proposer": 2, "bench_torch": 2, "export_vllm": 2,
                               "bench_vllm": 2, "report": 1}
    outputs = re.findall(r"output: ([^\s,]+)", out)
    assert not [o for o in outputs if "medusa" in o or "mtp" in o or "hidden" in o], outputs
    assert torch_jobs(out) == ["float32/chat_heldout_t07", "float32/chat_overlap"]
    assert vllm_jobs(out) == ["chat_heldout", "chat_overlap"]
    draft_lm = Path("src") / "specdec" / "methods" / "draft_lm.py"
    shutil.copy2(REPO / draft_lm, wd / draft_lm)
    # EAGLE-3: its training, export, the one PyTorch job of its chain and tree rows, its vLLM rows
    # (its learning-curve checkpoint only with that target)
    edit(wd / "src" / "specdec" / "methods" / "eagle3.py")
    out = smk(wd, "-n", "results/tables.md", "--cores", "1", *SMOKE).stdout
    assert job_counts(out) == {"train_proposer": 1, "bench_torch": 1, "export_vllm": 1,
                               "bench_vllm": 1, "report": 1}
    assert "checkpoints/eagle3/ttt2_records3/manifest.json" not in out
    curve = smk(wd, "-n", "results/learning_curve.md", "--cores", "1", *SMOKE).stdout
    assert job_counts(curve) == {"train_proposer": 2, "learning_curve": 1}
    assert torch_jobs(out) == ["float32/chat_overlap"] and vllm_jobs(out) == ["chat_overlap"]
    assert all("eagle3" in o or o.startswith(("results/tables", "results/plots", "results/rows",
                                              "results/torch/float32/chat_overlap",
                                              "results/vllm/chat_overlap")) or "readme" in o
               for o in re.findall(r"output: ([^\s,]+)", out)), out
    shutil.copy2(REPO / "src" / "specdec" / "methods" / "eagle3.py", wd / "src" / "specdec" / "methods" / "eagle3.py")
    # an edit of the shared core reruns every benchmark, but not the data sets or the target
    edit(wd / "src" / "specdec" / "core" / "verify.py")
    counts = job_counts(smk(wd, "-n", "results/tables.md", "--cores", "1", *SMOKE).stdout)
    shutil.copy2(REPO / "src" / "specdec" / "core" / "verify.py", wd / "src" / "specdec" / "core" / "verify.py")
    assert counts["bench_torch"] == 5 and "chat_set" not in counts and "target_model" not in counts
    # the smoke directory is shared with later tests (test_slurm.py among them): left as it was
    assert "Nothing to be done" in smk(wd, "-n", "results/tables.md", "--cores", "1", *SMOKE).stdout
