"""The torch benchmark backend end to end on a tiny random checkpoint (seconds)."""
import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from conftest import VOCAB, tiny_llama
from specdec.backends.torch_bench import bench_torch
from specdec.data.records import write_jsonl


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    model = tiny_llama()
    model.config.max_position_embeddings = 160
    model.generation_config.eos_token_id = 2
    model.save_pretrained(path)
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="t2", pad_token="t0").save_pretrained(path)
    return path


def test_bench_pairs_every_method_with_the_baseline(tiny_ckpt, tmp_path):
    prompts = [{"id": f"p{i}", "prompt": "", "prompt_ids": [5 + (i + j) % 7 for j in range(12)] * 2}
               for i in range(3)]
    prompts.append({"id": "too-long", "prompt": "", "prompt_ids": [7] * 100})  # 100 + 24 + 64 > 160
    write_jsonl(tmp_path / "p.jsonl", prompts)
    common = dict(target_dir=str(tiny_ckpt), prompts_path=str(tmp_path / "p.jsonl"), dataset="wiki",
                  max_new_tokens=24, warmup=1, dtype="float32", resamples=500)
    with pytest.raises(ValueError, match="timed inside every method's job"):
        bench_torch(method="baseline", variant=None, params={}, out_records=str(tmp_path / "b.jsonl"),
                    out_summary=str(tmp_path / "b.json"), **common)
    ngram = {"draft_len": 3, "prompt_lookup_min": 1}
    for method, variant, params, other in [("ngram", "k3", ngram, {}),
                                           ("suffix", "d6", {"draft_len": 6, "max_tree_depth": 6}, {}),
                                           ("hf_generate", "greedy", {}, {}),
                                           ("hf_prompt_lookup", "k3", {"prompt_lookup_num_tokens": 3},
                                            {"counterpart": "ngram", "counterpart_params": ngram})]:
        s = bench_torch(method=method, variant=variant, params=params,
                        out_records=str(tmp_path / f"{method}.jsonl"), out_summary=str(tmp_path / f"{method}.json"),
                        **common, **other)
        assert s["prompts"] == 3 and s["skipped_prompts"] == 1 and s["skipped"][0]["id"] == "too-long"
        if other:  # the counterpart arm ran on the same prompts, interleaved, with the same outputs
            assert s["same_run"]["counterpart"] == other["counterpart"]
            assert s["same_run"]["same_outputs"] == 3 and s["same_run"]["counterpart_speedup"] > 0
            lo, hi = s["same_run"]["counterpart_speedup_ci"]
            assert lo <= s["same_run"]["counterpart_speedup"] <= hi
        assert s["matches_baseline"] == 3, (method, s["diverged_prompts"])
        assert s["method"] == f"{method}/{variant}" and s["timing"] == "paired"
        # the speedup is the baseline arm's wall time over this arm's, in this job, with its interval
        assert s["speedup"] == pytest.approx(s["baseline_wall_s"] / s["wall_s"])
        lo, hi = s["speedup_ci"]
        assert 0 < lo <= s["speedup"] <= hi and "bootstrap over 3 prompts" in s["speedup_ci_method"]
        saved = json.loads((tmp_path / f"{method}.json").read_text())
        assert saved["settings"]["params"] == params and saved["settings"]["dtype"] == "float32"
        assert {"isa", "native_bf16", "cpu_model"} <= set(saved["environment"]["cpu"])
        if not method.startswith("hf_"):
            assert s["drafted_tokens"] > 0 and s["tau"] >= 1
        records = [json.loads(line) for line in (tmp_path / f"{method}.jsonl").read_text().splitlines()]
        arms = {r["method"] for r in records}
        assert arms == {f"{method}/{variant}", "baseline"} | ({other["counterpart"]} if other else set())
        # the first draft is verified in the prefill's forward by every drafting method here
        assert all(r["fused_first_step"] is (method != "hf_generate") for r in records
                   if r["method"] == f"{method}/{variant}"), method
        assert all(r["fused_first_step"] is False for r in records if r["method"] == "baseline")
    recs = [json.loads(line) for line in (tmp_path / "ngram.jsonl").read_text().splitlines()]
    assert [r["id"] for r in recs if r["method"] == "ngram/k3"] == ["p0", "p1", "p2"]
    assert all(r["matches_baseline"] for r in recs)


def test_unknown_method_and_bad_params_are_errors(tiny_ckpt, tmp_path):
    write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "prompt": "", "prompt_ids": [5, 6]}])
    common = dict(target_dir=str(tiny_ckpt), prompts_path=str(tmp_path / "p.jsonl"), dataset="wiki",
                  max_new_tokens=4, out_records=str(tmp_path / "r.jsonl"), out_summary=str(tmp_path / "s.json"))
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        bench_torch(method="nope", variant="x", params={}, **common)
    with pytest.raises(ValueError, match="unknown draft_length"):
        bench_torch(method="ngram", variant="x", params={"draft_length": 3}, **common)
    assert not (tmp_path / "r.jsonl").exists()


def test_cli_reports_bad_input_with_file_and_line(tiny_ckpt, tmp_path):
    import subprocess
    import sys
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "", "prompt_ids": [5]}\n{"id": "b", "prompt_ids": [5,\n')
    proc = subprocess.run([sys.executable, "-m", "specdec", "bench-torch", "--target", str(tiny_ckpt),
                           "--prompts", str(bad), "--dataset", "wiki", "--method", "ngram",
                           "--max-new-tokens", "4", "--out-records", str(tmp_path / "r.jsonl"),
                           "--out-summary", str(tmp_path / "s.json")], capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"{bad}: line 2: malformed JSON" in proc.stderr
    good = tmp_path / "good.jsonl"
    good.write_text('{"id": "a", "prompt": "", "prompt_ids": [5]}\n')
    proc = subprocess.run([sys.executable, "-m", "specdec", "bench-torch", "--target", str(tmp_path / "missing"),
                           "--prompts", str(good), "--dataset", "wiki", "--method", "ngram",
                           "--max-new-tokens", "4", "--out-records", str(tmp_path / "r.jsonl"),
                           "--out-summary", str(tmp_path / "s.json")], capture_output=True, text=True)
    assert proc.returncode == 1 and f"{tmp_path / 'missing'}: checkpoint directory not found" in proc.stderr
