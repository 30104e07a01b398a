"""Tuned variants (backends/tuning.py): candidates from each method's tuning grid, the choice from
their costs on a tuning split the benchmark never reads, and the tuned arm beside the fixed one
(seconds, on a tiny random checkpoint)."""
import json

import pytest

from specdec import methods
from specdec.backends.cost_curve import cost_curve
from specdec.backends.torch_bench import bench_torch
from specdec.backends.tuning import MARGIN, candidate_arms, choose, pick, tune_torch, tuned_arms
from specdec.data.records import RecordError, read_prompts, write_json, write_jsonl
from specdec.report.rows import rows_frame
from specdec.report.tables import render_tables


@pytest.mark.parametrize("name", methods.names())
def test_every_grid_starts_at_the_fixed_variant_and_names_its_parameters(name):
    params = methods.module(name).EXAMPLE["params"]
    if methods.is_learned(name):
        params = {**params, "checkpoint": "ckpt"}
    grid = methods.tuning_candidates(name, params)
    assert grid[0] == params
    assert all(json.dumps(g, sort_keys=True) not in {json.dumps(h, sort_keys=True) for h in grid[:i]}
               for i, g in enumerate(grid))
    for g in grid:   # one parameter changed, and every candidate a valid variant
        assert len({k for k in g if g[k] != params.get(k)}) <= 1
        methods.check_params(name, g)
    if methods.is_control(name):
        assert grid == [params]        # a negative control is never tuned


def test_candidates_skip_peers_and_controls_and_name_what_they_change():
    arms = [{"method": "ngram", "variant": "k3", "params": {"draft_len": 3}},
            {"method": "null_drafter", "variant": "k1", "params": {"token_id": 0, "draft_len": 1}},
            {"method": "hf_prompt_lookup", "variant": "k3", "params": {}, "compare_with": "ngram/k3"}]
    (group,) = candidate_arms(arms)
    assert group["fixed"] == "ngram/k3"
    names = [c["variant"] for c in group["candidates"]]
    assert names[0] == "k3" and "k3.draft_len2" in names and "k3.draft_len3" not in names
    assert all(c["params"]["draft_len"] == int(c["variant"].rpartition("len")[2])
               for c in group["candidates"][1:])


def test_a_candidate_replaces_the_fixed_variant_only_by_a_margin():
    def cands(*speedups):
        return [{"variant": f"v{i}", "predicted_decode_speedup": x} for i, x in enumerate(speedups)]

    assert pick(cands(1.50, 1.52, 1.40))["variant"] == "v0"          # within the margin: the fixed one
    assert pick(cands(1.50, 1.40, 1.50 * (1 + MARGIN) + 0.01))["variant"] == "v2"
    assert pick(cands(1.50, 1.60, 1.70))["variant"] == "v2"           # the best, not the first better one
    assert pick(cands(1.20))["variant"] == "v0"


def test_the_tuning_split_is_the_records_after_the_benchmarks(tmp_path):
    write_jsonl(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": "", "prompt_ids": [5]} for i in range(5)])
    assert [p["id"] for p in read_prompts(tmp_path / "p.jsonl", 2, skip=3)] == ["p3", "p4"]
    with pytest.raises(RecordError, match=r"p.jsonl: 5 records; the split after the first 4 needs 2 more"):
        read_prompts(tmp_path / "p.jsonl", 2, skip=4)


def test_a_tuned_variant_is_chosen_on_the_split_and_timed_beside_the_fixed_one(tiny_ckpt, tmp_path):
    # prompts that repeat: n-gram lookup drafts and is accepted on the tiny target
    prompts = [{"id": f"p{i}", "prompt": "", "prompt_ids": [5 + (i + j) % 4 for j in range(8)] * 4} for i in range(5)]
    write_jsonl(tmp_path / "p.jsonl", prompts)
    sets = {"wiki": {"prompts": str(tmp_path / "p.jsonl"), "limit": 3, "max_new_tokens": 24}}
    cost_curve(target_dir=str(tiny_ckpt), sets=sets, dtypes=["float32"], out=str(tmp_path / "c.json"),
               threads=1, repeats=3, warmup=1)
    arms = [{"method": "ngram", "variant": "k3", "params": {"draft_len": 3, "prompt_lookup_min": 1}},
            {"method": "null_drafter", "variant": "k1", "params": {"token_id": 0, "draft_len": 1}}]
    bench = dict(target_dir=str(tiny_ckpt), prompts_path=str(tmp_path / "p.jsonl"), dataset="wiki",
                 max_new_tokens=24, warmup=0, dtype="float32", threads=1, resamples=200)
    out = tune_torch(arms=arms, cost_curve=str(tmp_path / "c.json"), out=str(tmp_path / "t.json"),
                     out_records=str(tmp_path / "tr.jsonl"), out_summary=str(tmp_path / "ts.json"),
                     skip=3, limit=2, **bench)
    assert json.loads((tmp_path / "t.json").read_text()) == json.loads(json.dumps(out))
    # the split: the two records after the three the benchmark reads, every candidate and the baseline
    records = [json.loads(line) for line in (tmp_path / "tr.jsonl").read_text().splitlines()]
    assert {r["id"] for r in records} == {"p3", "p4"}
    (choice,) = out["choices"]                     # the control has no grid
    cands = choice["candidates"]
    assert choice["fixed"] == "ngram/k3" and len(cands) == len(methods.tuning_candidates("ngram", arms[0]["params"]))
    best = pick(cands)
    assert choice["chosen"] == best["variant"] and choice["params"] == best["params"]
    assert choice["same_as_fixed"] == (best["variant"] == "k3") and choice["variant"] == "k3.tuned"
    assert all(c["tau"] >= 1 and c["verify_cost"] > 0 and c["draft_cost"] >= 0 for c in cands)
    # the prediction is the cost account: t / (D + V)
    for c in cands:
        cost = c["draft_cost"] + c["verify_cost"]
        assert c["predicted_decode_speedup"] == pytest.approx(c["tokens_per_step"] / cost)

    # the benchmark job: a tuned arm where the choice differs from the fixed variant
    for different in (False, True):
        tuning = json.loads((tmp_path / "t.json").read_text())
        # either choice, whatever the tiny target's costs chose
        fixed, *rest = tuning["choices"][0]["candidates"]
        other = rest[0] if different else fixed
        tuning["choices"][0].update(same_as_fixed=not different, chosen=other["variant"], params=other["params"])
        write_json(tmp_path / "t2.json", tuning)
        extra, choices = tuned_arms(str(tmp_path / "t2.json"), arms)
        assert [a["variant"] for a in extra] == (["k3.tuned"] if different else [])
        s = bench_torch(arms=arms + extra, tuning=choices, limit=3, out_records=str(tmp_path / "r.jsonl"),
                        out_summary=str(tmp_path / "s.json"), **bench)
        rows = {r["method"]: r for r in s["rows"]}
        assert rows["ngram/k3"]["tuning"]["same_as_fixed"] is not different
        assert "tuning" not in rows["null_drafter/k1"]
        if different:
            tuned = rows["ngram/k3.tuned"]
            assert tuned["settings"]["params"] == other["params"] and tuned["matches_baseline"] == 3
            assert tuned["tuning"]["chosen"] == other["variant"]
        # the tables say what was chosen, and show both rows
        md = render_tables(rows_frame([tmp_path / "s.json"]))
        assert "## Tuned variants" in md
        line = next(x for x in md.splitlines() if x.startswith("- wiki, ") and "ngram/k3 tuned to" in x)
        assert (other["variant"] in line and ", tuned " in line) if different else "the fixed variant itself" in line

    # the candidates are predicted from the step costs timed in the tuning job itself: a cost curve
    # without the set changes nothing; without the job's own step costs, the curve is the reference,
    # and one without the set gives no prediction, no choice
    curve = json.loads((tmp_path / "c.json").read_text())
    curve["points"] = [{**p, "dataset": "chat_heldout"} for p in curve["points"]]
    write_json(tmp_path / "c2.json", curve)
    own = choose(str(tmp_path / "ts.json"), candidate_arms(arms), str(tmp_path / "c2.json"))
    assert own == choose(str(tmp_path / "ts.json"), candidate_arms(arms), str(tmp_path / "c.json"))
    summary = json.loads((tmp_path / "ts.json").read_text())
    write_json(tmp_path / "ts2.json", {**summary, "rows": [{k: v for k, v in r.items() if k != "step_costs"}
                                                           for r in summary["rows"]]})
    assert choose(str(tmp_path / "ts2.json"), candidate_arms(arms), str(tmp_path / "c.json")) != own
    with pytest.raises(ValueError, match=r"c2.json: no cost curve for float32 on wiki: cannot predict ngram/k3"):
        choose(str(tmp_path / "ts2.json"), candidate_arms(arms), str(tmp_path / "c2.json"))

    # a fixed variant whose parameters changed after its tuning: the tuning is stale
    moved = [{**arms[0], "params": {**arms[0]["params"], "draft_len": 4}}, arms[1]]
    with pytest.raises(ValueError, match="ngram/k3's parameters changed since it was tuned"):
        tuned_arms(str(tmp_path / "t.json"), moved)
    with pytest.raises(ValueError, match="ngram/k3 is not an arm of this job"):
        tuned_arms(str(tmp_path / "t.json"), arms[1:])
