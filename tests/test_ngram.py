import pytest

from specdec.methods.ngram import NgramConfig, NgramProposer


def propose(ids, **cfg):
    p = NgramProposer(NgramConfig(**cfg))
    p.start(ids[:1], None)
    return p.propose(list(ids))


def test_longest_suffix_ngram_most_recent_occurrence():
    #        0  1  2  3  4  5  6  7  8  9 10 11 12 13
    ids = [1, 2, 3, 9, 9, 1, 2, 3, 7, 7, 5, 1, 2, 3]
    d = propose(ids, draft_len=3, prompt_lookup_min=2, prompt_lookup_max=4)
    # suffix [1,2,3] occurs at 0 and 5; the most recent earlier one (5) is followed by 7, 7, 5
    assert d.tokens == [7, 7, 5] and d.parents == [-1, 0, 1]


def test_prefers_longer_match_over_recency():
    ids = [4, 1, 2, 8, 8, 0, 1, 2, 6, 6, 4, 1, 2]
    d = propose(ids, draft_len=2, prompt_lookup_min=2, prompt_lookup_max=3)
    assert d.tokens == [8, 8]  # [4,1,2] matches at 0; [1,2] alone would pick the later 6, 6


def test_min_length_and_no_match():
    assert propose([1, 2, 3, 4, 5], draft_len=3, prompt_lookup_min=1, prompt_lookup_max=3) is None
    assert propose([1, 2, 5, 6, 2], draft_len=3, prompt_lookup_min=2, prompt_lookup_max=3) is None
    assert propose([1, 2, 5, 6, 2], draft_len=3, prompt_lookup_min=1, prompt_lookup_max=3).tokens == [5, 6, 2]


def test_draft_may_run_into_the_suffix_and_is_cut_at_draft_len():
    ids = [5, 5, 5, 5]
    assert propose(ids, draft_len=8, prompt_lookup_min=1, prompt_lookup_max=2).tokens == [5]
    assert propose([3, 1, 2, 3, 1, 2, 3], draft_len=2, prompt_lookup_min=2, prompt_lookup_max=3).tokens == [1, 2]


def test_incremental_index_equals_fresh_index():
    import random
    rng = random.Random(0)
    ids = [rng.randrange(4) for _ in range(30)]
    p = NgramProposer(NgramConfig(draft_len=4, prompt_lookup_min=1, prompt_lookup_max=3))
    p.start(ids[:5], None)
    seq = ids[:5]
    for t in ids[5:]:
        seq.append(t)
        inc = p.propose(seq)
        fresh = propose(list(seq), draft_len=4, prompt_lookup_min=1, prompt_lookup_max=3)
        assert (inc and inc.tokens) == (fresh and fresh.tokens)


def test_bad_config():
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        NgramConfig(prompt_lookup_min=4, prompt_lookup_max=3)
