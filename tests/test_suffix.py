import json

import pytest

from specdec.methods.suffix import SuffixCache, SuffixConfig, SuffixProposer, SuffixTrie, speculate


def brute_counts(seqs, depth):
    counts = {}
    for s in seqs:
        for i in range(len(s)):
            for j in range(i + 1, min(len(s), i + depth) + 1):
                counts[tuple(s[i:j])] = counts.get(tuple(s[i:j]), 0) + 1
    return counts


def trie_counts(trie):
    out, stack = {}, [((), trie.root)]
    while stack:
        path, node = stack.pop()
        for t, c in node.children.items():
            out[path + (t,)] = c.count
            stack.append((path + (t,), c))
    return out


def test_trie_counts_every_substring_up_to_depth():
    seqs = [[1, 2, 3, 1, 2, 4, 1, 2, 3], [2, 3, 5]]
    trie = SuffixTrie(depth=4)
    for s in seqs:
        trie.add(s)
    assert trie_counts(trie) == brute_counts(seqs, 4)
    trie.remove(seqs[0])
    assert trie_counts(trie) == brute_counts(seqs[1:], 4)


def test_speculate_is_frequency_ordered_tree():
    trie = SuffixTrie(depth=6)
    trie.add([7, 1, 2, 7, 1, 2, 7, 1, 3, 7, 4])
    node = trie.find([7])
    draft, score = speculate(node, budget=3, max_depth=6, min_prob=0.0)
    # after 7: 1 (3 of 4), 4 (1 of 4); after 7,1: 2 (2 of 3), 3 (1 of 3)
    assert draft.tokens[0] == 1 and draft.parents[0] == -1
    assert draft.tokens[1] == 2 and draft.parents[1] == 0          # 0.75 * 2/3 = 0.5
    assert draft.tokens[2] == 7 and draft.parents[2] == 1  # 0.5 * 2/2 beats 3 and 4 (0.25)
    assert score == pytest.approx(0.75 + 0.5 + 0.5)
    small, _ = speculate(node, budget=8, max_depth=6, min_prob=0.3)
    assert 3 not in small.tokens and 4 not in small.tokens  # 0.25 < min_token_prob


def test_proposer_respects_depth_and_spec_factor():
    p = SuffixProposer(SuffixConfig(draft_len=16, max_tree_depth=6, max_spec_factor=1.0))
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    p.start(prompt, None)
    d = p.propose(list(prompt))
    assert d.tokens[:3] == [4, 5, 6]
    assert len(d) <= 3  # match length 3 (or less) and p + depth <= 6


def test_global_cache_bounded_persisted_and_reloaded(tmp_path):
    path = tmp_path / "cache.json"
    cfg = dict(draft_len=4, max_tree_depth=6, global_cache=True, max_cached_requests=2, cache_path=str(path))
    p = SuffixProposer(SuffixConfig(**cfg))
    outputs = [[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]]
    for out in outputs:
        p.start([1], None)
        p.propose([1] + out)  # the loop's ids: prompt + generated
    p.close()
    saved = json.loads(path.read_text())
    assert saved["requests"] == outputs[1:]  # bounded: the oldest was evicted
    q = SuffixProposer(SuffixConfig(**cfg))
    assert list(q.cache.requests) == outputs[1:]
    q.start([5], None)
    d = q.propose([5, 30, 31])  # only the global cache knows what follows 30, 31
    assert d.tokens[:1] == [32]
    assert q.propose([5, 10, 11]) is None or q.propose([5, 10, 11]).tokens[:1] != [12]


def test_corrupt_cache_file_is_an_error(tmp_path):
    bad = tmp_path / "cache.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=str(bad)):
        SuffixCache(4, 10, str(bad))
