import pytest

from specdec.core.metrics import acceptance_stats, attach_baseline, first_divergence, make_record, summarize


def rec(i, wall, ttft, new, drafted=None, accepted=None, out=None):
    return make_record(id=i, dataset="d", method="m", prompt_tokens=10, new_tokens=new, wall_s=wall,
                       ttft_s=ttft, fused_first_step=False, draft_s=0.0, steps=len(drafted) if drafted else None,
                       drafted=drafted, accepted=accepted, draft_depth=None, output_ids=out or [1] * new,
                       matches_baseline=None, first_divergence=None)


def test_acceptance_definitions():
    s = acceptance_stats([4, 4, 0, 4], [4, 1, 0, 2])
    assert s["acceptance_rate"] == pytest.approx(7 / 12)
    assert s["tau"] == pytest.approx((7 + 4) / 4)  # tokens per verification step
    # per position i: share of drafting steps whose first i+1 drafts were accepted
    assert s["acceptance_by_position"] == pytest.approx([1.0, 2 / 3, 1 / 3, 1 / 3])
    assert s["drafting_steps"] == 3


def test_summary_speedups_and_matches():
    base = [rec("a", 2.0, 0.5, 10), rec("b", 4.0, 1.0, 20)]
    meth = [rec("a", 1.0, 0.5, 10, [3, 3], [3, 2]), rec("b", 1.0, 1.0, 20, [3], [0], out=[1] * 19 + [2])]
    attach_baseline(meth, base)
    assert [r["matches_baseline"] for r in meth] == [True, False]
    assert meth[1]["first_divergence"] == 19
    s = summarize(meth, base, {"dtype": "float32"})
    assert s["speedup"] == pytest.approx(6.0 / 2.0)
    assert s["mean_prompt_speedup"] == pytest.approx((2.0 + 4.0) / 2)
    assert s["decode_speedup"] == pytest.approx((6.0 - 1.5) / (2.0 - 1.5))
    assert s["throughput_tok_s"] == pytest.approx(30 / 2.0)
    assert s["matches_baseline"] == 1 and s["diverged_prompts"] == ["b"]
    assert s["token_count_mismatches"] == 0


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([1, 5, 3], [1, 2, 3]) == 1


def test_record_schema_is_enforced():
    with pytest.raises(ValueError, match="missing"):
        make_record(id="x")


def test_missing_baseline_record_is_an_error():
    with pytest.raises(ValueError, match="no baseline record"):
        attach_baseline([rec("z", 1, 0, 1)], [rec("a", 1, 0, 1)])


def test_per_position_acceptance_of_a_tree_runs_to_its_depth():
    # 12-node trees of depth 3: three positions, not twelve
    s = acceptance_stats([12, 12, 12, 12], [3, 1, 0, 2], depth=[3, 3, 3, 3])
    assert s["acceptance_by_position"] == [0.75, 0.5, 0.25]
    assert s["acceptance_rate"] == 6 / 48 and s["tau"] == (6 + 4) / 4
