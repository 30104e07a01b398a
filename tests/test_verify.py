import random

import pytest

from specdec.core.tree import ancestor_matrix, check_parents, depths, is_chain, root_paths
from specdec.core.verify import verify_chain, verify_tree


def brute_force_tree(tokens, parents, target_next):
    """Longest root path whose every token equals the target's argmax at its parent."""
    best = [0]
    for path in root_paths(parents):
        ok = [0]
        for a, b in zip(path, path[1:]):
            if tokens[b] != target_next[a]:
                break
            ok.append(b)
        if len(ok) > len(best):
            best = ok
    return best, target_next[best[-1]]


def test_verify_chain_cases():
    assert verify_chain([5, 6, 7], [5, 6, 7, 8]) == ([0, 1, 2, 3], 8)  # all accepted + bonus
    assert verify_chain([5, 9, 7], [5, 6, 7, 8]) == ([0, 1], 6)        # stop at first mismatch
    assert verify_chain([9], [5, 6]) == ([0], 5)                        # nothing accepted
    assert verify_chain([], [4]) == ([0], 4)


def test_verify_tree_against_brute_force():
    rng = random.Random(0)
    for _ in range(500):
        n = rng.randint(1, 12)
        parents = [-1] + [rng.randrange(i) for i in range(1, n)]
        tokens = [rng.randrange(4) for _ in range(n)]
        # siblings with equal tokens are allowed: paths may then tie; lengths must agree
        target_next = [rng.randrange(4) for _ in range(n)]
        path, nxt = verify_tree(tokens, parents, target_next)
        ref_path, ref_next = brute_force_tree(tokens, parents, target_next)
        assert len(path) == len(ref_path) or _has_duplicate_siblings(tokens, parents)
        # whatever path was picked must be valid and its next token the target's
        for a, b in zip(path, path[1:]):
            assert parents[b] == a and tokens[b] == target_next[a]
        assert nxt == target_next[path[-1]]
        if not _has_duplicate_siblings(tokens, parents):
            assert (path, nxt) == (ref_path, ref_next)


def _has_duplicate_siblings(tokens, parents):
    seen = set()
    for i in range(1, len(tokens)):
        if (parents[i], tokens[i]) in seen:
            return True
        seen.add((parents[i], tokens[i]))
    return False


def test_chain_is_a_tree():
    rng = random.Random(1)
    for _ in range(200):
        k = rng.randint(0, 6)
        draft = [rng.randrange(3) for _ in range(k)]
        target_next = [rng.randrange(3) for _ in range(k + 1)]
        parents = list(range(-1, k))
        assert verify_chain(draft, target_next) == verify_tree([0] + draft, parents, target_next)


def test_tree_helpers():
    parents = [-1, 0, 0, 1, 1, 2]
    check_parents(parents)
    assert depths(parents) == [0, 1, 1, 2, 2, 2]
    assert not is_chain(parents) and is_chain([-1, 0, 1])
    vis = ancestor_matrix(parents)
    assert vis[3].tolist() == [True, True, False, True, False, False]
    assert vis[5].tolist() == [True, False, True, False, False, True]
    assert sorted(map(tuple, root_paths(parents))) == [(0, 1, 3), (0, 1, 4), (0, 2, 5)]
    with pytest.raises(ValueError):
        check_parents([-1, 2, 0])
