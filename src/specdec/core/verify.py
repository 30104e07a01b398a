"""The one greedy verifier: a draft is accepted exactly where it equals the target's argmax.

`target_next[i]` is the target's greedy token after node i (node 0 is the pending root token).
Both functions return the accepted node path (starting at the root) and the next token, which
is the target's own token after the last accepted node (the "bonus" token). Output is therefore
identical to plain greedy decoding whatever the draft was.
"""
from __future__ import annotations


def verify_chain(draft: list[int], target_next: list[int]) -> tuple[list[int], int]:
    """draft[i] is node i+1; target_next has len(draft)+1 entries."""
    n = 0
    while n < len(draft) and draft[n] == target_next[n]:  # accept while draft == argmax of target
        n += 1
    return list(range(n + 1)), target_next[n]


def verify_tree(tokens: list[int], parents: list[int], target_next: list[int]) -> tuple[list[int], int]:
    """Longest root path whose every token equals the target's argmax at its parent."""
    children: dict[int, list[int]] = {}
    for i in range(1, len(tokens)):
        children.setdefault(parents[i], []).append(i)
    path, node = [0], 0
    while True:
        want = target_next[node]
        nxt = next((c for c in children.get(node, ()) if tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        node = nxt
