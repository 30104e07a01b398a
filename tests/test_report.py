import json

import pytest

from specdec.report.tables import END, START, patch_readme, write_report


def summary(method, dtype="float32", speedup=None, per_pos=None, dataset="wiki"):
    s = {"method": method, "dataset": dataset, "prompts": 4, "skipped_prompts": 0, "new_tokens": 100,
         "wall_s": 10.0, "throughput_tok_s": 10.0, "settings": {"backend": "torch", "method": method.split("/")[0],
                                                               "dtype": dtype, "max_new_tokens": 32},
         "acceptance_by_position": per_pos or []}
    if speedup:
        s.update(speedup=speedup, baseline_wall_s=10.0 * speedup, baseline_throughput_tok_s=10.0 / speedup,
                 median_prompt_speedup=speedup, decode_speedup=speedup, acceptance_rate=0.5, tau=2.0,
                 matches_baseline=4, token_count_mismatches=0, draft_shape="chain k=5")
    return s


def test_report_tables_plots_and_readme(tmp_path):
    paths = []
    for i, s in enumerate([summary("baseline"), summary("ngram/k5", speedup=2.5, per_pos=[0.8, 0.6]),
                           {**summary("hf_generate/greedy", speedup=0.95),
                            "same_run": {"counterpart": "baseline", "counterpart_speedup": 1.05,
                                         "counterpart_median_prompt_speedup": 1.04, "throughput_tok_s": 9.5,
                                         "counterpart_throughput_tok_s": 10.0, "same_outputs": 4}}]):
        p = tmp_path / f"{i}.summary.json"
        p.write_text(json.dumps(s))
        paths.append(str(p))
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nintro\n\n{START}\nold\n{END}\n\nfooter\n")
    write_report(paths, str(tmp_path / "tables.md"), str(tmp_path / "plots"), str(tmp_path / "section.md"),
                 str(readme))
    tables = (tmp_path / "tables.md").read_text()
    assert "| non-vLLM PyTorch loop | ngram/k5 | chain k=5 | float32 | 4 |" in tables
    assert "2.500x" in tables and "HF transformers generate (peer)" in tables
    assert "ours (baseline) vs hf_generate/greedy: **1.050x** its speed" in tables
    assert "| ngram/k5 | PyTorch loop, float32 | 80.00% | 60.00% |" in tables
    text = readme.read_text()
    assert text.startswith("# title\n\nintro\n\n") and text.endswith("\n\nfooter\n") and "old" not in text
    assert "![speedup](plots/speedup.png)" in text
    for png in ("speedup", "throughput", "acceptance_by_position"):
        assert (tmp_path / "plots" / f"{png}.png").stat().st_size > 1000


def test_readme_without_markers_is_an_error(tmp_path):
    (tmp_path / "R.md").write_text("no markers")
    with pytest.raises(ValueError, match="no results markers"):
        patch_readme(str(tmp_path / "R.md"), "x")
