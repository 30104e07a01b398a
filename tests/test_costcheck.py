"""The cost curve and the check of every PyTorch row's speedup against its costs (seconds)."""
import json
import time

import pandas as pd
import pytest

from conftest import tiny_llama
from specdec.backends import torch_bench
from specdec.backends.cost_curve import cells, context_ids, context_length, cost_curve, tree_parents
from specdec.core.tree import depths
from specdec.data.records import write_jsonl
from specdec.report.costcheck import TOLERANCE, check_costs, plain_steps, predict, read_curve
from specdec.report.rows import rows_frame


def test_the_tree_is_binary_and_trees_start_at_three_nodes():
    parents = [-1] + [p + 1 for p in tree_parents(14)]           # node 0: the pending token
    assert parents[:7] == [-1, 0, 0, 1, 1, 2, 2]
    assert max(depths(parents)) == 3                              # 15 nodes: a full binary tree of depth 3
    assert ("tree", 2) not in cells() and ("tree", 3) in cells() and ("chain", 1) in cells()
    prompts = [{"prompt_ids": [1, 2, 3]}, {"prompt_ids": [4, 5, 6, 7, 8]}]
    assert context_length(prompts, 64) == 4 + 32
    assert context_ids(prompts, 20) == ([1, 2, 3, 4, 5, 6, 7, 8] * 3)[:20]


def test_the_curve_is_timed_per_dtype_and_set(tiny_ckpt, tmp_path):
    write_jsonl(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": "", "prompt_ids": [5 + i] * 30} for i in range(3)])
    sets = {"wiki": {"prompts": str(tmp_path / "p.jsonl"), "limit": 2, "max_new_tokens": 20}}
    out = cost_curve(target_dir=str(tiny_ckpt), sets=sets, dtypes=["float32", "float32"], out=str(tmp_path / "c.json"),
                     threads=1, repeats=3, warmup=1, sizes=(1, 2, 4))
    assert out["contexts"] == {"wiki": 40} and out["memory_read_gb_s"] > 0
    (floor,) = out["floors"]                                      # float32 listed twice: timed once
    n_params = sum(p.numel() for p in tiny_llama().parameters())
    assert floor["weight_bytes"] == 4 * n_params and floor["weight_read_floor_ms"] > 0
    got = {(p["shape"], p["nodes"]): p for p in out["points"]}
    assert set(got) == {("chain", 1), ("chain", 2), ("chain", 4), ("tree", 4)}
    assert got[("chain", 1)]["plain_steps"] == 1.0
    assert all(p["repeats"] == 3 and p["context"] == 40 and p["ms_min"] <= p["ms"] <= p["ms_max"]
               for p in out["points"])
    _, frame = read_curve(tmp_path / "c.json")
    assert plain_steps(frame, "float32", "wiki", "tree", 2) == plain_steps(frame, "float32", "wiki", "chain", 2)
    assert plain_steps(frame, "bfloat16", "wiki", "chain", 2) is None
    with pytest.raises(ValueError, match="missing field"):
        cost_curve(target_dir=str(tiny_ckpt), sets={"wiki": {"prompts": "x"}}, dtypes=["float32"], out="x")


def _curve(slope=0.1):
    """r(n) = 1 + slope (n - 1) for chains, 1 + 2 slope (n - 1) for trees."""
    return pd.DataFrame([{"dtype": "float32", "dataset": "chat", "shape": shape, "nodes": n,
                          "plain_steps": 1 + (1 if shape == "chain" else 2) * slope * (n - 1)}
                         for shape in ("chain", "tree") for n in (1, 2, 4, 8) if shape == "chain" or n >= 4])


def _row(base_ms=50.0, verify_steps=1.3, draft_ms=10.0, tau=2.0, prompts=4, tokens=64, drafted=3.0):
    """A summary row whose measured figures follow from the given costs (the baseline decodes the
    same tokens); verify_steps: its verification steps in the baseline's plain steps."""
    decode_tokens = prompts * (tokens - 1)
    steps = decode_tokens / tau
    decode_s = steps * (draft_ms + verify_steps * base_ms) / 1000
    base_decode_s = decode_tokens * base_ms / 1000
    base_wall = base_decode_s + prompts * 0.05
    return {"backend": "torch", "dtype": "float32", "dataset": "chat", "draft_shape": f"chain k={int(drafted)}",
            "prompts": prompts, "decode_s": decode_s, "decode_speedup": base_decode_s / decode_s,
            "draft_ms_per_step": draft_ms, "target_ms_per_step": verify_steps * base_ms, "steps": steps,
            "drafting_steps": steps, "drafted_tokens": drafted * steps, "baseline_wall_s": base_wall,
            "baseline_throughput_tok_s": prompts * tokens / base_wall, "speedup": 1.0, "ci_low": 0.9, "ci_high": 1.1}


def test_a_row_whose_steps_cost_what_the_curve_says_is_predicted_exactly():
    curve = _curve()
    row = _row(verify_steps=1.3)          # chain of 3 drafts: 4 nodes, r = 1.3
    acc = predict(row, curve)
    assert acc["baseline_ms_per_token"] == pytest.approx(50.0)
    assert acc["draft_cost"] == pytest.approx(0.2) and acc["verify_cost"] == pytest.approx(1.3)
    assert acc["tokens_per_step"] == pytest.approx(2.0)
    assert acc["predicted_decode_speedup"] == pytest.approx(2.0 / 1.5) == pytest.approx(row["decode_speedup"])
    frame = check_costs(pd.DataFrame([row]), curve)
    assert frame["_cost"].iloc[0] is None and frame["cost_gap"].iloc[0] == pytest.approx(0, abs=1e-9)
    # a tree's step costs what the tree curve says; steps with no draft cost one plain step
    tree = dict(row, draft_shape="tree 4 nodes", drafting_steps=row["steps"] / 2)
    assert predict(tree, curve)["verify_cost"] == pytest.approx(0.5 * 1 + 0.5 * (1 + 0.2 * 6))
    # not our loop, no per-step costs, or no curve for the row's dtype: no account
    assert predict(dict(row, backend="vllm"), curve) is None
    assert predict(dict(row, draft_ms_per_step=None), curve) is None
    assert predict(dict(row, dtype="bfloat16"), curve) is None


def test_a_row_is_checked_against_its_own_jobs_step_costs_before_the_host_curve():
    """A row with step costs timed in its job reads those (even as the frame's JSON text); the host's
    curve only serves a row without them."""
    row = _row(verify_steps=1.3)                    # 4 nodes: the curve says 1.3 plain steps
    own = _curve(slope=0.2)[["shape", "nodes", "plain_steps"]].to_dict("records")   # r(4) = 1.6 in its job
    for costs in (own, json.dumps(own)):
        acc = predict(dict(row, step_costs=costs), _curve())
        assert acc["verify_reference"] == "job" and acc["verify_cost"] == pytest.approx(1.6)
        assert predict(dict(row, step_costs=costs), None)["verify_cost"] == pytest.approx(1.6)
    # the job measured verification dearer than the row's steps cost: flagged against the job's costs
    assert check_costs(pd.DataFrame([dict(row, step_costs=json.dumps(own))]), _curve())["_cost"].iloc[0]
    assert predict(row, _curve())["verify_reference"] == "host curve" and predict(row, None) is None


def test_verification_cheaper_or_dearer_than_the_curve_flags_the_row():
    curve = _curve()
    cheap = check_costs(pd.DataFrame([_row(verify_steps=1.3 / 1.25)]), curve).iloc[0]
    assert cheap["cost_gap"] > TOLERANCE and "above" in cheap["_cost"] and "not a result" in cheap["_cost"]
    dear = check_costs(pd.DataFrame([_row(verify_steps=1.3 * 1.25)]), curve).iloc[0]
    assert dear["cost_gap"] < -TOLERANCE and "below" in dear["_cost"]
    near = check_costs(pd.DataFrame([_row(verify_steps=1.3 * 1.05)]), curve).iloc[0]
    assert near["_cost"] is None


def _loaded_decode(monkeypatch, arm_is_loaded, delay_s):
    """Every target forward of the arms that arm_is_loaded(proposer) picks runs `delay_s` late: load
    on one arm of the job only."""
    real = torch_bench.decode

    def decode(target, ids, max_new_tokens, eos, proposer=None, **kw):
        if not arm_is_loaded(proposer):
            return real(target, ids, max_new_tokens, eos, proposer, **kw)
        forward = target.forward

        def slow(*args, **kwargs):
            time.sleep(delay_s)
            return forward(*args, **kwargs)
        target.forward = slow
        try:
            return real(target, ids, max_new_tokens, eos, proposer, **kw)
        finally:
            del target.forward
    monkeypatch.setattr(torch_bench, "decode", decode)


@pytest.mark.parametrize("loaded, direction", [("baseline", "above"), ("method", "below")])
def test_a_row_timed_under_load_on_one_arm_is_flagged(tiny_ckpt, tmp_path, monkeypatch, loaded, direction):
    """A job whose baseline arm (or method arm) runs under load: the measured speedup moves away
    from what the row's costs predict with the step costs timed between the job's arms, without the load."""
    prompts = [{"id": f"p{i}", "prompt": "", "prompt_ids": [5 + (i + j) % 4 for j in range(8)] * 4} for i in range(4)]
    write_jsonl(tmp_path / "p.jsonl", prompts)
    sets = {"wiki": {"prompts": str(tmp_path / "p.jsonl"), "limit": None, "max_new_tokens": 32}}
    cost_curve(target_dir=str(tiny_ckpt), sets=sets, dtypes=["float32"], out=str(tmp_path / "c.json"),
               threads=1, repeats=5, warmup=1)
    _loaded_decode(monkeypatch, (lambda p: p is None) if loaded == "baseline" else (lambda p: p is not None),
                   delay_s=0.02)
    torch_bench.bench_torch(target_dir=str(tiny_ckpt), prompts_path=str(tmp_path / "p.jsonl"), dataset="wiki",
                            arms=[{"method": "ngram", "variant": "k3",
                                   "params": {"draft_len": 3, "prompt_lookup_min": 1}}],
                            max_new_tokens=32, warmup=0, dtype="float32", threads=1, resamples=200,
                            out_records=str(tmp_path / "r.jsonl"), out_summary=str(tmp_path / "s.json"))
    row = check_costs(rows_frame([tmp_path / "s.json"]), read_curve(tmp_path / "c.json")[1]).iloc[0]
    assert row["tau"] > 1.5                                   # the n-gram arm drafts and is accepted
    assert row["verify_reference"] == "job"                   # timed between the arms, without the load
    costs = json.loads((tmp_path / "s.json").read_text())["step_costs"]
    assert {(c["shape"], c["nodes"]) for c in costs} == set(cells()) and all(c["repeats"] == 4 for c in costs)
    assert isinstance(row["_cost"], str) and direction in row["_cost"], row["cost_account"]
