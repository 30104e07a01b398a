import json
from xml.etree import ElementTree

import pandas as pd
import pytest

from specdec.report.build import write_report
from specdec.report.drift import write_drift
from specdec.report.publish import patch, publish
from specdec.report.rows import rows_frame
from specdec.report.tables import END, START

CPU = {"cpu_model": "AMD EPYC", "isa": "AVX2", "native_bf16": False, "bf16_flags": []}


def summary(method, dtype="float32", speedup=None, per_pos=None, dataset="wiki", backend="torch",
            requested=None, ci=None):
    s = {"method": method, "dataset": dataset, "prompts": 4, "skipped_prompts": 0, "new_tokens": 100,
         "wall_s": 10.0, "throughput_tok_s": 10.0,
         "settings": {"backend": backend, "method": method.split("/")[0], "variant": method.split("/")[-1],
                      "dtype": dtype, "dtype_requested": requested or dtype,
                      "dtype_reason": "CPU has no native bf16 matmul (ISA AVX2)" if requested == "auto" else "set",
                      "max_new_tokens": 32, "params": {"draft_len": 5}},
         "environment": {"cpu": CPU, "torch": "2.13"},
         "acceptance_by_position": per_pos or []}
    if backend == "vllm":
        s["settings"].update(mode="serial", max_num_seqs=1, requests_in_flight=1)
    if speedup:
        s.update(speedup=speedup, speedup_ci=ci or [speedup * 0.9, speedup * 1.1], speedup_ci_half_width=0.1,
                 speedup_ci_method="paired percentile bootstrap over 4 prompts", timing="paired",
                 baseline_wall_s=10.0 * speedup, baseline_throughput_tok_s=10.0 / speedup,
                 median_prompt_speedup=speedup, decode_speedup=speedup, acceptance_rate=0.5, tau=2.0,
                 matches_baseline=4, token_count_mismatches=0, draft_shape="chain k=5")
    return s


def write(tmp_path, summaries, sub=""):
    paths = []
    for i, s in enumerate(summaries):
        p = tmp_path / sub / f"{i}.summary.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(s))
        paths.append(str(p))
    return paths


def test_report_rows_tables_plots_and_readme(tmp_path, monkeypatch):
    paths = write(tmp_path, [
        summary("ngram/k5", "float32", 2.5, [0.8, 0.6], dataset="chat_heldout", requested="auto", ci=[2.25, 2.8]),
        summary("ngram/k5", "float32", 1.2, dataset="chat_overlap"),
        # a vLLM job's summary: every row of its method variant
        {"method": "ngram/k5", "rows": [
            summary("ngram/k5", "bfloat16", 1.9, dataset="wiki", backend="vllm", requested="auto"),
            summary("ngram/k5", "bfloat16", 1.1, dataset="chat_heldout", backend="vllm", requested="auto")]},
        {**summary("hf_prompt_lookup/k5", "float32", 2.0, requested="auto"),
         "same_run": {"counterpart": "ngram", "counterpart_speedup": 1.05, "counterpart_speedup_ci": [1.0, 1.1],
                      "same_outputs": 4}},
        {**summary("suffix/d8", dataset="wiki", backend="vllm"), "error": "ImportError: Arctic Inference is required"},
    ])
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nintro\n\n{START}\nold\n{END}\n\nfooter\n")
    before = readme.read_text()
    monkeypatch.chdir(tmp_path)   # the section's links are relative to the working directory
    write_report(paths, "tables.md", "plots", "section.md", out_rows="rows.parquet")
    assert readme.read_text() == before   # the report writes only its outputs
    done = publish("README.md", "section.md", benchmarks="none", drift_table="none.md")
    assert "job costs NOT written" in done[1] and "drift table NOT written" in done[2]
    rows = pd.read_parquet(tmp_path / "rows.parquet")
    assert len(rows) == 6
    vllm_ngram = rows[rows["backend"].eq("vllm") & rows["method"].eq("ngram")]
    assert sorted(vllm_ngram["dataset"]) == ["chat_heldout", "wiki"]
    for col in ("backend", "mode", "dataset", "dtype", "method", "variant", "speedup", "ci_low", "ci_high",
                "speedup_ci_method", "tau", "acceptance_rate", "matches_baseline", "headline",
                "environment.cpu.isa", "environment.cpu.native_bf16", "settings.dtype_reason",
                "settings.params.draft_len"):
        assert col in rows.columns, col
    head = rows[rows["headline"]]
    assert list(head["method"]) == ["ngram"] and head["ci_low"].iloc[0] == 2.25
    tables = (tmp_path / "tables.md").read_text()
    assert "2.50x [2.25, 2.80]" in tables                 # the speedup with its interval
    assert "Host: AMD EPYC, ISA AVX2, native bf16 matmuls: no." in tables
    assert "Speed dtype (`auto`): float32 (CPU has no native bf16 matmul (ISA AVX2))." in tables
    assert "ours (ngram) ran **1.05x** [1.00, 1.10] its speed" in tables
    assert "not run: ImportError: Arctic Inference is required" in tables
    assert "vLLM serial (1 request in flight)" in tables
    assert "ngram/k5 (PyTorch loop, float32 (auto)) | 80.0%" in tables.replace("  ", "")
    text = readme.read_text()
    assert text.startswith("# title\n\nintro\n\n") and text.endswith("\n\nfooter\n") and "old" not in text
    assert "![speedup](plots/speedup.png)" in text
    for png in ("speedup", "throughput", "acceptance_by_position"):
        assert (tmp_path / "plots" / f"{png}.png").stat().st_size > 1000


def test_sampled_rows_beside_the_greedy_ones(tmp_path):
    """A set sampled at T > 0 over the held-out prompts: its own section after the greedy one,
    titled from it, a column of the headline table, no token-by-token matches."""
    def at(s, dataset, t=None):
        s["dataset"] = dataset
        s["settings"]["prompts_file"] = "data/chat/eval_heldout.jsonl"
        if t is not None:
            s["settings"]["sampling"] = {"temperature": t, "top_p": 1.0, "top_k": 0, "seed": 0}
            s["matches_baseline"] = None
        return s
    paths = write(tmp_path, [
        at(summary("ngram/k5", "bfloat16", 1.5, dataset="chat_heldout", requested="auto"), "chat_heldout"),
        at(summary("ngram/k5", "bfloat16", 1.3, requested="auto", ci=[1.2, 1.4]), "chat_heldout_t07", 0.7),
        at(summary("ngram/k5", "bfloat16", 1.1, backend="vllm", requested="auto"), "chat_heldout_t07", 0.7),
    ])
    write_report(paths, str(tmp_path / "tables.md"), str(tmp_path / "plots"), str(tmp_path / "section.md"),
                 out_rows=str(tmp_path / "rows.parquet"), out_html=str(tmp_path / "rows.html"))
    rows = pd.read_parquet(tmp_path / "rows.parquet")
    assert sorted(rows["temperature"]) == [0.0, 0.7, 0.7] and rows["headline"].sum() == 1
    page = (tmp_path / "rows.html").read_text()   # the report's inline table
    table = ElementTree.fromstring(page[page.index("<table"): page.index("</table>") + len("</table>")])
    header = [th.text for th in table.iter("th")]
    cells = [[td.text for td in tr.iter("td")] for tr in table.find("tbody")]
    assert header[:5] == ["backend", "mode", "dataset", "dtype", "method"] and len(cells) == 3
    assert sorted(float(row[header.index("speedup")]) for row in cells) == [1.1, 1.3, 1.5]
    tables = (tmp_path / "tables.md").read_text()
    head = tables.split("## Headline")[1].split("\n## ")[0]
    assert "Held-out T=0.7 speedup [95% CI]" in head and "1.30x [1.20, 1.40]" in head
    greedy = tables.index("## Chat, held-out prompts (disjoint from training)\n")
    sampled = tables.index("## Chat, held-out prompts (disjoint from training), sampled at T = 0.7 (top-p 1, "
                           "top-k off, prompt i with seed 0 + i)")
    assert greedy < sampled
    section = tables[sampled:].split("\n## ")[0]
    lines = [line for line in section.splitlines() if line.startswith(("| PyTorch", "| vLLM"))]
    assert len(lines) == 2 and all(line.split("|")[-2].strip() == "-" for line in lines)   # no matches


def test_failed_controls_mark_their_jobs_rows(tmp_path):
    """A null drafter whose interval lies above 1.0, or an A/A arm whose interval excludes 1.0,
    marks every row of its job (path, dtype, data set) and says by how much; passing controls
    mark nothing."""
    def job(dataset, null_ci, aa_ci):
        return [summary("ngram/k5", "bfloat16", 1.5, dataset=dataset, requested="auto"),
                summary("null_drafter/k1", "bfloat16", sum(null_ci) / 2, dataset=dataset, requested="auto", ci=null_ci),
                summary("baseline/aa", "bfloat16", sum(aa_ci) / 2, dataset=dataset, requested="auto", ci=aa_ci)]
    paths = write(tmp_path, job("chat_heldout", [0.92, 1.01], [0.97, 1.03]) + job("wiki", [1.10, 1.30], [1.02, 1.08]))
    write_report(paths, str(tmp_path / "tables.md"), str(tmp_path / "plots"), str(tmp_path / "section.md"),
                 out_rows=str(tmp_path / "rows.parquet"))
    tables = (tmp_path / "tables.md").read_text()
    failed = tables.split("**Failed controls.**")[1].split("\n## ")[0]
    assert "- wiki, PyTorch loop, bfloat16: " in failed
    assert "the null drafter (null_drafter/k1) read 1.20x [1.10, 1.30], above 1.0: speedups here are inflated by at " \
           "least 10%" in failed
    assert "the A/A arm read 1.05x [1.02, 1.08], excluding 1.0: speedups here are off by about 5%" in failed
    assert "chat_heldout" not in failed
    wiki = tables.split("## Extractive Wikipedia")[1].split("\n## ")[0]
    held = tables.split("## Chat, held-out prompts")[1].split("\n## ")[0]
    assert wiki.count("(!)") == 3 and "(!)" not in held
    passing = write(tmp_path, job("chat_heldout", [0.92, 1.01], [0.97, 1.03]), sub="ok")
    write_report(passing, str(tmp_path / "ok.md"), str(tmp_path / "plots"), str(tmp_path / "ok_section.md"),
                 out_rows=str(tmp_path / "ok.parquet"))
    assert "Failed controls" not in (tmp_path / "ok.md").read_text()


def test_two_summaries_for_one_row_are_an_error(tmp_path):
    paths = write(tmp_path, [summary("ngram/k5", speedup=2.0), summary("ngram/k5", speedup=2.1)])
    with pytest.raises(ValueError, match="two summaries for one row"):
        write_report(paths, str(tmp_path / "t.md"), str(tmp_path / "p"), str(tmp_path / "s.md"))


def test_auto_and_float32_rows_stay_apart_where_auto_is_float32(tmp_path):
    """On a host whose speed dtype is float32, the `auto` job (speed rows) and the `float32` job
    (lossless checks) time the same methods in fp32: two rows, each named by what it was asked."""
    paths = write(tmp_path, [summary("ngram/k5", speedup=2.0, dataset="chat_heldout", requested="auto"),
                             summary("ngram/k5", speedup=1.5, dataset="chat_overlap", requested="auto"),
                             summary("ngram/k5", speedup=1.4, dataset="chat_overlap")])
    write_report(paths, str(tmp_path / "t.md"), str(tmp_path / "p"), str(tmp_path / "s.md"))
    frame = rows_frame(paths)
    assert sorted(frame[frame["dataset"] == "chat_overlap"]["dtype_requested"]) == ["auto", "float32"]
    head = (tmp_path / "s.md").read_text()
    assert "2.00x" in head and "1.50x" in head and "1.40x" not in head   # the overlap cell: the auto row


def test_the_overlap_probe_is_read_in_the_held_out_dtype(tmp_path):
    """The headline's train-overlap cell: the chat_overlap row in the held-out rows' dtype. On a
    float32 host the float32 job alone serves it; on a bf16 host the fp32 lossless job never does,
    and with no overlap row in the held-out dtype the headline has no train-overlap columns."""
    def section(held_dtype):
        paths = write(tmp_path / held_dtype, [
            summary("ngram/k5", held_dtype, 2.0, dataset="chat_heldout", requested="auto"),
            summary("ngram/k5", speedup=1.4, dataset="chat_overlap")])
        write_report(paths, str(tmp_path / "t.md"), str(tmp_path / "p"), str(tmp_path / "s.md"))
        return (tmp_path / "s.md").read_text()

    assert section("float32").split("| ngram/k5", 1)[1].split("|")[4].strip() == "1.40x [1.26, 1.54]"
    assert "Train-overlap" not in section("bfloat16")


def test_drift_between_two_runs(tmp_path):
    first = write(tmp_path, [summary("ngram/k5", "float32", 2.0, dataset="chat_heldout", requested="auto"),
                             summary("pard/len3", "float32", 1.5, dataset="chat_heldout", requested="auto")], "a")
    second = write(tmp_path, [summary("ngram/k5", "float32", 2.1, dataset="chat_heldout", requested="auto"),
                              summary("pard/len3", "float32", 1.44, dataset="chat_heldout", requested="auto")], "b")
    repro = tmp_path / "repro.md"
    repro.write_text("x\n<!-- drift:start -->\n<!-- drift:end -->\ny\n")
    both = write_drift(first, second, str(tmp_path / "drift.md"))
    assert list(both["drift"].round(3)) == [0.05, -0.04]
    text = (tmp_path / "drift.md").read_text()
    assert "largest speedup drift on a chat row in the speed dtype: **5.0%**" in text and "+5.0%" in text
    (tmp_path / "README.md").write_text(f"{START}\n{END}\n")
    (tmp_path / "section.md").write_text("results\n")
    done = publish(str(tmp_path / "README.md"), str(tmp_path / "section.md"), str(tmp_path / "none"),
                   str(tmp_path / "drift.md"), str(repro))
    assert done[2].endswith("drift table from " + str(tmp_path / "drift.md"))
    assert "-4.0%" in repro.read_text() and repro.read_text().endswith("<!-- drift:end -->\ny\n")


def test_readme_without_markers_is_an_error(tmp_path):
    (tmp_path / "R.md").write_text("no markers")
    with pytest.raises(ValueError, match="R.md: no markers <!-- results:start -->"):
        patch(str(tmp_path / "R.md"), "x", START, END)
    with pytest.raises(FileNotFoundError, match="no results section"):
        publish(str(tmp_path / "R.md"), str(tmp_path / "missing.md"))


def test_job_costs_sum_snakemakes_benchmark_files(tmp_path):
    from specdec.report.costs import job_costs, render_costs
    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    for rule, name, secs, rss in [("train_proposer", "a", 120.0, 900.0), ("train_proposer", "b", 60.0, 1200.0),
                                  ("bench_torch", "results/x", 30.0, 700.0)]:
        f = tmp_path / rule / f"{name}.tsv"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(header + f"{secs}\t0:00:00\t{rss}\t0\t0\t0\t0\t0\t0\t0\n")
    costs = job_costs(str(tmp_path))
    assert costs.loc["train_proposer", "jobs"] == 2 and costs.loc["train_proposer", "minutes"] == 3.0
    assert costs.loc["train_proposer", "peak_rss_mb"] == 1200.0 and costs.loc["bench_torch", "jobs"] == 1
    assert "3 jobs, 3.5 minutes of job time in all." in render_costs(costs)
    with pytest.raises(ValueError, match="no Snakemake benchmark files"):
        job_costs(str(tmp_path / "none"))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{START}\n{END}\n<!-- costs:start -->\nold\n<!-- costs:end -->\nafter\n")
    (tmp_path / "section.md").write_text("results\n")
    publish(str(readme), str(tmp_path / "section.md"), str(tmp_path), str(tmp_path / "none.md"))
    text = readme.read_text()
    assert "old" not in text and "| train_proposer |" in text and text.endswith("<!-- costs:end -->\nafter\n")


def test_the_vllm_lossless_job_gives_match_counts_not_speedups(tmp_path):
    """vllm.lossless rows (settings.role "lossless", float32): their match counts fill the
    headline's vLLM lossless column; their speedups stay out of its vLLM cells, out of the control
    checks (a null drafter there reading above 1.0 marks nothing) and out of the plots."""
    def vllm(method, speedup, requested, role=None, proposer="vllm", ci=None, matches=4):
        s = summary(method, "bfloat16" if requested == "auto" else "float32", speedup, dataset="chat_heldout",
                    backend="vllm", requested=requested, ci=ci)
        s["settings"].update(proposer=proposer, **({"role": role} if role else {}))
        s["matches_baseline"] = matches
        return s
    paths = write(tmp_path, [
        summary("ngram/k5", "bfloat16", 1.3, dataset="chat_heldout", requested="auto"),
        summary("ngram/k5", "float32", 1.2, dataset="chat_overlap"),
        vllm("ngram/k5", 1.25, "auto"),
        vllm("ngram/k5", 1.9, "float32", role="lossless", matches=3),
        vllm("null_drafter/k5", 1.5, "float32", role="lossless", proposer="specdec", ci=[1.3, 1.7])])
    write_report(paths, str(tmp_path / "t.md"), str(tmp_path / "plots"), str(tmp_path / "s.md"),
                 out_rows=str(tmp_path / "rows.parquet"))
    tables = (tmp_path / "t.md").read_text()
    head = tables.split("## Headline")[1].split("\n## ")[0]
    assert "vLLM lossless (fp32 matches)" in head and "3/4" in head
    assert "1.25x" in head and "1.90x" not in head
    assert "Failed controls" not in tables and "(!)" not in tables
    assert "vLLM serial, lossless check" in tables


def test_a_cli_error_is_one_line_and_its_traceback_one_variable_away(tmp_path, capsys, monkeypatch):
    """specdec prints one line naming the problem; SPECDEC_TRACEBACK=1 adds the traceback."""
    from specdec.cli import main
    args = ["report", "--summaries", str(tmp_path / "none.json"), "--out-tables", str(tmp_path / "t.md"),
            "--out-rows", str(tmp_path / "r.parquet"), "--plots-dir", str(tmp_path), "--readme-section",
            str(tmp_path / "s.md")]
    monkeypatch.delenv("SPECDEC_TRACEBACK", raising=False)
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "none.json: file not found" in err and "Traceback" not in err
    monkeypatch.setenv("SPECDEC_TRACEBACK", "1")
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().endswith("none.json: file not found")
