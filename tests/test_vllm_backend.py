"""The vLLM backend's pure parts: method mapping, counter arithmetic, and the shared schema."""

import pytest

from specdec.backends.vllm_bench import acceptance_from_counters
from specdec.core.metrics import acceptance_stats, attach_baseline, make_record, summarize


def speculative_config(method, params, export_dir=None):
    from specdec.methods import vllm_config
    return vllm_config(method, params, export_dir)


def test_speculative_config_mapping():
    assert speculative_config("ngram", {"draft_len": 5, "prompt_lookup_min": 1, "prompt_lookup_max": 8}) == {
        "method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1, "prompt_lookup_max": 8}
    sfx = speculative_config("suffix", {"draft_len": 8, "max_tree_depth": 8, "max_spec_factor": 1.0,
                                        "min_token_prob": 0.0})
    assert sfx["method"] == "suffix" and sfx["suffix_decoding_max_tree_depth"] == 8
    # MTP: served from the MiMo export; one draft token per module step asked for
    assert speculative_config("mtp", {"checkpoint": "x", "num_speculative_steps": 2}) == {
        "method": "mtp", "num_speculative_tokens": 2}
    assert speculative_config("mtp", {"checkpoint": "x"})["num_speculative_tokens"] == 1
    # EAGLE-3: its LlamaForCausalLMEagle3 export as the draft; chain mode only
    assert speculative_config("eagle3", {"checkpoint": "x", "draft_len": 2}, "exp") == {
        "method": "eagle3", "model": "exp", "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match="chain mode"):
        speculative_config("eagle3", {"checkpoint": "x", "draft_len": 4, "tree_topk": 3}, "exp")
    with pytest.raises(ValueError, match="--draft-model"):
        speculative_config("eagle3", {"checkpoint": "x"})
    with pytest.raises(ValueError, match="no vLLM counterpart"):
        speculative_config("medusa", {})


def test_counters_are_differenced_and_match_our_definitions():
    before = {"drafts": 10, "draft_tokens": 50, "accepted": 20, "per_pos": [8, 6, 4, 2, 0]}
    after = {"drafts": 14, "draft_tokens": 70, "accepted": 31, "per_pos": [12, 9, 6, 3, 1]}
    a = acceptance_from_counters(before, after)
    assert a["acceptance_rate"] == pytest.approx(11 / 20)
    assert a["tau"] == pytest.approx(1 + 11 / 4)
    assert a["acceptance_by_position"] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.25])
    # the same four steps through our own per-step definition
    ours = acceptance_stats([5, 5, 5, 5], [5, 3, 2, 1])
    assert ours["acceptance_rate"] == pytest.approx(a["acceptance_rate"])
    assert ours["tau"] == pytest.approx(a["tau"])
    assert ours["acceptance_by_position"] == pytest.approx(a["acceptance_by_position"])


def _recs(walls):
    return [make_record(id=f"p{i}", dataset="wiki", method="ngram/k5", prompt_tokens=5, new_tokens=10, wall_s=w,
                        ttft_s=None, fused_first_step=None, draft_s=None, steps=None, drafted=None, accepted=None,
                        draft_depth=None, output_ids=[1] * 10,
                        matches_baseline=None, first_divergence=None) for i, w in enumerate(walls)]


def test_batched_summary_has_the_same_fields_as_the_torch_one():
    base, recs = _recs([None, None]), _recs([None, None])
    attach_baseline(recs, base)
    # four ABBA rounds of the whole batch per engine: the method twice as fast in each
    walls = {"method": [2.0, 2.1, 1.9, 2.0], "baseline": [4.0, 4.2, 3.8, 4.0]}
    batched = summarize(recs, base, {"dtype": "bfloat16"}, [], round_walls=walls)
    assert batched["speedup"] == pytest.approx(2.0) and batched["throughput_tok_s"] == pytest.approx(10.0)
    assert batched["speedup_ci"] == pytest.approx([2.0, 2.0]) and "4 alternating rounds" in batched["speedup_ci_method"]
    assert batched["timing"] == "paired" and batched["matches_baseline"] == 2
    serial_base, serial = _recs([1.0, 1.0]), _recs([0.5, 0.5])
    attach_baseline(serial, serial_base)
    torch_like = summarize(serial, serial_base, {"dtype": "bfloat16"}, resamples=200)
    assert set(batched) - {"round_walls_s", "baseline_round_walls_s"} == set(torch_like)


def test_bench_vllm_reexecs_once_with_intel_openmp_preloaded(monkeypatch, tmp_path):
    """vLLM on CPU wants libiomp in LD_PRELOAD; the CLI re-execs itself with the environment's
    libiomp5.so (from the intel-openmp wheel) when it is there and not yet preloaded."""
    from specdec.backends import vllm_bench as cli
    lib = tmp_path / "lib" / "libiomp5.so"
    lib.parent.mkdir()
    lib.write_bytes(b"")
    monkeypatch.setattr(cli.sys, "prefix", str(tmp_path))
    calls = []
    monkeypatch.setattr(cli.os, "execve", lambda exe, argv, env: calls.append((argv, env)))
    monkeypatch.delenv("SPECDEC_NO_IOMP_PRELOAD", raising=False)
    monkeypatch.setenv("LD_PRELOAD", "/x/libfoo.so")
    cli.preload_intel_openmp(["bench-vllm", "--mode", "serial"])
    (argv, env), = calls
    assert argv[1:] == ["-m", "specdec", "bench-vllm", "--mode", "serial"]
    assert env["LD_PRELOAD"] == f"{lib}:/x/libfoo.so"
    monkeypatch.setenv("LD_PRELOAD", env["LD_PRELOAD"])  # the re-executed process: nothing more
    cli.preload_intel_openmp(["bench-vllm"])
    monkeypatch.setenv("LD_PRELOAD", "")
    lib.unlink()  # CUDA vLLM: no intel-openmp, no re-exec
    cli.preload_intel_openmp(["bench-vllm"])
    assert len(calls) == 1
