"""The torch benchmark backend end to end on a tiny random checkpoint (seconds)."""
import json
from collections import Counter

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from conftest import VOCAB, tiny_llama
from specdec.backends.torch_bench import bench_torch
from specdec.core.stats import balanced, rotated
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


def test_one_job_pairs_every_method_with_one_baseline(tiny_ckpt, tmp_path):
    prompts = [{"id": f"p{i}", "prompt": "", "prompt_ids": [5 + (i + j) % 7 for j in range(12)] * 2}
               for i in range(3)]
    prompts.append({"id": "too-long", "prompt": "", "prompt_ids": [7] * 100})  # 100 + 24 + 64 > 160
    write_jsonl(tmp_path / "p.jsonl", prompts)
    common = dict(target_dir=str(tiny_ckpt), prompts_path=str(tmp_path / "p.jsonl"), dataset="wiki",
                  max_new_tokens=24, warmup=1, dtype="float32", resamples=500,
                  out_records=str(tmp_path / "r.jsonl"), out_summary=str(tmp_path / "s.json"))
    with pytest.raises(ValueError, match="timed inside every job"):
        bench_torch(arms=[{"method": "baseline", "variant": None, "params": {}}], **common)
    ngram = {"draft_len": 3, "prompt_lookup_min": 1}
    arms = [{"method": "ngram", "variant": "k3", "params": ngram},
            {"method": "suffix", "variant": "d6", "params": {"draft_len": 6, "max_tree_depth": 6}},
            {"method": "hf_generate", "variant": "greedy", "params": {}},
            {"method": "hf_prompt_lookup", "variant": "k3", "params": {"prompt_lookup_num_tokens": 3},
             "compare_with": "ngram/k3"}]
    out = bench_torch(arms=arms, **common)
    assert json.loads((tmp_path / "s.json").read_text()) == json.loads(json.dumps(out))
    assert [s["method"] for s in out["rows"]] == ["ngram/k3", "suffix/d6", "hf_generate/greedy", "hf_prompt_lookup/k3"]
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    base = [r for r in records if r["method"] == "baseline"]
    # one baseline arm for every method: three prompts, decoded once each
    assert [r["id"] for r in base] == ["p0", "p1", "p2"]
    for arm, s in zip(arms, out["rows"]):
        label = f"{arm['method']}/{arm['variant']}"
        assert s["prompts"] == 3 and s["skipped_prompts"] == 1 and s["skipped"][0]["id"] == "too-long"
        assert s["matches_baseline"] == 3, (label, s["diverged_prompts"])
        assert s["timing"] == "paired"
        # the speedup is the shared baseline arm's wall time over this arm's, in this job, with its interval
        assert s["baseline_wall_s"] == pytest.approx(sum(r["wall_s"] for r in base))
        assert s["speedup"] == pytest.approx(s["baseline_wall_s"] / s["wall_s"])
        lo, hi = s["speedup_ci"]
        assert 0 < lo <= s["speedup"] <= hi and "bootstrap over 3 prompts" in s["speedup_ci_method"]
        assert s["settings"]["params"] == arm["params"] and s["settings"]["dtype"] == "float32"
        assert s["settings"]["arms"] == [a["method"] + "/" + a["variant"] for a in arms] + ["baseline"]
        assert {"isa", "native_bf16", "cpu_model"} <= set(s["environment"]["cpu"])
        if not arm["method"].startswith("hf_"):
            assert s["drafted_tokens"] > 0 and s["tau"] >= 1
        mine = [r for r in records if r["method"] == label]
        assert [r["id"] for r in mine] == ["p0", "p1", "p2"] and all(r["matches_baseline"] for r in mine)
        # the first draft is verified in the prefill's forward by every drafting method here
        assert all(r["fused_first_step"] is (arm["method"] != "hf_generate") for r in mine), label
    assert all(r["fused_first_step"] is False for r in base)
    # the peer's arm of ours ran on the same prompts, in the same job, with the same outputs
    same = out["rows"][3]["same_run"]
    assert same["counterpart"] == "ngram/k3" and same["same_outputs"] == 3 and same["counterpart_speedup"] > 0
    lo, hi = same["counterpart_speedup_ci"]
    assert lo <= same["counterpart_speedup"] <= hi
    assert "same_run" not in out["rows"][0]


def test_the_controls_a_null_drafter_and_an_a_a_arm(tiny_ckpt, tmp_path):
    """The null drafter drafts on every step and is never accepted (tau 1, outputs equal); the A/A
    arm is a second baseline with a row of its own, timed in the same rotation."""
    prompts = [{"id": f"p{i}", "prompt": "", "prompt_ids": [5 + (i + j) % 7 for j in range(12)]} for i in range(3)]
    write_jsonl(tmp_path / "p.jsonl", prompts)
    # the tiny target's greedy output never holds token 0 on these prompts (checked below)
    out = bench_torch(target_dir=str(tiny_ckpt), prompts_path=str(tmp_path / "p.jsonl"), dataset="wiki",
                      arms=[{"method": "null_drafter", "variant": "k4", "params": {"token_id": 0, "draft_len": 4}}],
                      max_new_tokens=16, warmup=0, dtype="float32", resamples=200, aa_control=True,
                      out_records=str(tmp_path / "r.jsonl"), out_summary=str(tmp_path / "s.json"))
    null, aa = out["rows"]
    assert null["method"] == "null_drafter/k4" and aa["method"] == "baseline/aa"
    assert null["settings"]["arms"] == aa["settings"]["arms"] == ["null_drafter/k4", "baseline", "baseline/aa"]
    # a draft on every step but a prompt's last (one token left), 4 tokens but near the end
    assert null["steps"] - 3 <= null["drafting_steps"] < 3 * null["drafting_steps"] < null["drafted_tokens"]
    assert null["drafted_tokens"] <= 4 * null["drafting_steps"]
    assert null["accepted_tokens"] == 0 and null["tau"] == 1.0
    assert null["matches_baseline"] == aa["matches_baseline"] == 3
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert all(0 not in r["output_ids"] for r in records if r["method"] == "baseline")
    assert not aa["drafted_tokens"] and aa["speedup"] > 0 and aa["timing"] == "paired"


@pytest.mark.parametrize("n", [3, 4, 5, 16, 17])
def test_the_arm_order_is_balanced_for_position_and_neighbour(n):
    names = [f"arm{i}" for i in range(n)]
    cycle = n if n % 2 == 0 else 2 * n
    orders = [balanced(names, i) for i in range(2 * cycle)]
    assert all(sorted(o) == sorted(names) for o in orders) and orders[:cycle] == orders[cycle:]
    per_cycle = 1 if n % 2 == 0 else 2
    for name in names:   # over a cycle, each arm runs equally often in each position
        assert Counter(o.index(name) for o in orders[:cycle]) == {k: per_cycle for k in range(n)}
    # ... and right after each other arm equally often (rotating a fixed list would keep its neighbours)
    pairs = Counter((o[j], o[j + 1]) for o in orders[:cycle] for j in range(n - 1))
    assert len(pairs) == n * (n - 1) and set(pairs.values()) == {per_cycle}
    rotations = Counter((o[j], o[j + 1]) for o in (rotated(names, i) for i in range(n)) for j in range(n - 1))
    assert len(rotations) < n * (n - 1)


def test_unknown_method_and_bad_arms_are_errors(tiny_ckpt, tmp_path):
    write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "prompt": "", "prompt_ids": [5, 6]}])
    common = dict(target_dir=str(tiny_ckpt), prompts_path=str(tmp_path / "p.jsonl"), dataset="wiki",
                  max_new_tokens=4, out_records=str(tmp_path / "r.jsonl"), out_summary=str(tmp_path / "s.json"))
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        bench_torch(arms=[{"method": "nope", "variant": "x", "params": {}}], **common)
    with pytest.raises(ValueError, match="unknown draft_length"):
        bench_torch(arms=[{"method": "ngram", "variant": "x", "params": {"draft_length": 3}}], **common)
    with pytest.raises(ValueError, match="ngram/x is listed twice"):
        bench_torch(arms=[{"method": "ngram", "variant": "x", "params": {}}] * 2, **common)
    with pytest.raises(ValueError, match="compare_with 'ngram/k5' is not an arm of this job"):
        bench_torch(arms=[{"method": "hf_prompt_lookup", "variant": "k5", "params": {},
                           "compare_with": "ngram/k5"}], **common)
    with pytest.raises(ValueError, match="no arms"):
        bench_torch(arms=[], **common)
    assert not (tmp_path / "r.jsonl").exists()


def test_a_job_planned_for_fp32_auto_stops_where_auto_is_bf16(tiny_ckpt, tmp_path, monkeypatch):
    """A job that runs its float32 arms (the lossless checks) in auto, planned for a host where
    auto is float32, stops on a bf16-native one rather than check in bf16; it runs where auto is float32."""
    from specdec import host
    write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "prompt": "", "prompt_ids": [5, 6]}])
    common = dict(target_dir=str(tiny_ckpt), prompts_path=str(tmp_path / "p.jsonl"), dataset="wiki",
                  max_new_tokens=4, out_records=str(tmp_path / "r.jsonl"), out_summary=str(tmp_path / "s.json"),
                  arms=[{"method": "ngram", "variant": "k5", "params": {}}], dtype="auto", require_dtype="float32",
                  warmup=0, resamples=10)
    monkeypatch.setattr(host, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    with pytest.raises(ValueError, match="runs its float32 arms in dtype auto.*here it is bfloat16.*sizing.host"):
        bench_torch(**common)
    assert not (tmp_path / "r.jsonl").exists()
    monkeypatch.setattr(host, "cpu_flags", lambda: {"avx2", "fma"})
    out = bench_torch(**common)
    assert out["dtype"] == "float32" and out["rows"][0]["settings"]["dtype_requested"] == "auto"


ARMS = json.dumps([{"method": "ngram", "variant": "k5", "params": {}}])


def test_cli_reports_bad_input_with_file_and_line(tiny_ckpt, tmp_path):
    import subprocess
    import sys
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "", "prompt_ids": [5]}\n{"id": "b", "prompt_ids": [5,\n')
    proc = subprocess.run([sys.executable, "-m", "specdec", "bench-torch", "--target", str(tiny_ckpt),
                           "--prompts", str(bad), "--dataset", "wiki", "--arms", ARMS,
                           "--max-new-tokens", "4", "--out-records", str(tmp_path / "r.jsonl"),
                           "--out-summary", str(tmp_path / "s.json")], capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"{bad}: line 2: malformed JSON" in proc.stderr
    good = tmp_path / "good.jsonl"
    good.write_text('{"id": "a", "prompt": "", "prompt_ids": [5]}\n')
    proc = subprocess.run([sys.executable, "-m", "specdec", "bench-torch", "--target", str(tmp_path / "missing"),
                           "--prompts", str(good), "--dataset", "wiki", "--arms", ARMS,
                           "--max-new-tokens", "4", "--out-records", str(tmp_path / "r.jsonl"),
                           "--out-summary", str(tmp_path / "s.json")], capture_output=True, text=True)
    assert proc.returncode == 1 and f"{tmp_path / 'missing'}: checkpoint directory not found" in proc.stderr


VLLM_PEER_JOB = """
import json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
from conftest import save_word_tokenizer
from specdec.backends.torch_bench import bench_torch
from specdec.core.loop import decode
from specdec.core.target import TargetModel
from specdec.data.records import write_jsonl

root = sys.argv[1]
torch.manual_seed(0)
# vLLM's CPU attention takes head sizes of 32 and up: 2 heads of 64
cfg = LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                  tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
model = LlamaForCausalLM(cfg).eval()
prompts = [{"id": f"p{i}", "prompt": "", "prompt_ids": [3 + (7 * i + 5 * j) % 60 for j in range(10 + i)]}
           for i in range(4)]
# EOS: a token the target emits early on the first prompt, so that some decodes stop there
eos = decode(TargetModel(model), prompts[0]["prompt_ids"], 6, set(), None).output_ids[-1]
model.config.eos_token_id = model.generation_config.eos_token_id = eos
model.save_pretrained(f"{root}/ckpt")
save_word_tokenizer(f"{root}/ckpt")
write_jsonl(f"{root}/p.jsonl", prompts)
torch.set_num_threads(2)
out = bench_torch(target_dir=f"{root}/ckpt", prompts_path=f"{root}/p.jsonl", dataset="wiki",
                  arms=[{"method": "vllm_generate", "variant": "greedy", "params": {"kv_cache_memory_bytes": 1 << 26}}],
                  max_new_tokens=24, warmup=1, dtype="float32", resamples=200,
                  out_records=f"{root}/r.jsonl", out_summary=f"{root}/s.json")
print(json.dumps({"eos": eos, "threads": torch.get_num_threads(), "row": out["rows"][0]}))
"""


def test_vllms_engine_is_a_peer_arm_of_our_baseline_in_one_job(tmp_path):
    """vLLM's plain greedy decoding, timed as an arm of our loop's job (in this job's process and
    threads), decodes what our baseline decodes in float32, EOS stops included. Run in a fresh
    process: vLLM's CPU worker replaces torch.set_num_threads process-wide once it starts."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    proc = subprocess.run([sys.executable, "-c", VLLM_PEER_JOB, str(tmp_path)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    row = got["row"]
    assert row["method"] == "vllm_generate/greedy" and row["prompts"] == 4 and row["timing"] == "paired"
    assert row["matches_baseline"] == 4, row["diverged_prompts"]
    assert row["speedup"] > 0 and row["settings"]["arms"] == ["vllm_generate/greedy", "baseline"]
    assert got["threads"] == 2 == row["environment"]["torch_threads"]
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    peer = [r for r in records if r["method"] == "vllm_generate/greedy"]
    # the first prompt stopped at EOS (6 tokens, EOS last), the same in both arms
    assert peer[0]["output_ids"][-1] == got["eos"] and len(peer[0]["output_ids"]) <= 6
    assert any(len(r["output_ids"]) == 24 for r in peer)
