"""The one verifier. Greedy: a draft is accepted exactly where it equals the target's argmax.
Sampling (T > 0): recursive rejection sampling, lossless in distribution (verify_sampled).

`target_next[i]` is the target's greedy token after node i (node 0 is the pending root token).
Both functions return the accepted node path (starting at the root) and the next token, which
is the target's own token after the last accepted node (the "bonus" token). Output is therefore
identical to plain greedy decoding whatever the draft was.
"""
from __future__ import annotations

import torch

from .sampling import Sampler


def verify_chain(draft: list[int], target_next: list[int]) -> tuple[list[int], int]:
    """draft[i] is node i+1; target_next has len(draft)+1 entries."""
    n = 0
    while n < len(draft) and draft[n] == target_next[n]:  # accept while draft == argmax of target
        n += 1
    return list(range(n + 1)), target_next[n]


def _children(parents: list[int]) -> dict[int, list[int]]:
    """node -> its children in node order (node 0, the root, has none above it)."""
    children: dict[int, list[int]] = {}
    for i in range(1, len(parents)):
        children.setdefault(parents[i], []).append(i)
    return children


def verify_tree(tokens: list[int], parents: list[int], target_next: list[int]) -> tuple[list[int], int]:
    """Longest root path whose every token equals the target's argmax at its parent."""
    children = _children(parents)
    path, node = [0], 0
    while True:
        want = target_next[node]
        nxt = next((c for c in children.get(node, ()) if tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        node = nxt


def verify_sampled(tokens: list[int], parents: list[int], q: torch.Tensor | None, p: torch.Tensor,
                   sampler: Sampler) -> tuple[list[int], int]:
    """Lossless verification at T > 0: recursive rejection sampling over a draft tree (a chain is
    the tree with one child per node; SpecInfer, and Leviathan et al. / Chen et al. on a chain).

    tokens/parents: the nodes, node 0 the pending root (parents[0] == -1). p: (n, V) the target's
    processed distribution after each node. q: (n - 1, V), q[i - 1] the distribution node i's
    token was drawn from; None: every draft token is a point mass (n-gram, suffix, a greedy or
    top-k drafter). Siblings must be drawn independently given their parent (point masses are).
    Returns the accepted node path (from the root) and the next token, so the emitted tokens are
    distributed exactly as sampling from the target token by token."""
    children = _children(parents)
    path, node = [0], 0
    while True:
        residual = p[node]
        for c in children.get(node, ()):
            x = tokens[c]
            qx = 1.0 if q is None else float(q[c - 1, x])
            # accept x with probability min(1, r(x) / q(x)), r the residual target distribution
            if sampler.uniform() * qx < float(residual[x]):
                path.append(c)
                node = c
                break
            # rejected: the next sibling is tested against r' = norm(max(0, r - q))
            residual = _remove(residual, x, None if q is None else q[c - 1])
        else:
            return path, sampler.draw(residual)  # every child rejected (or a leaf): draw from r


def _remove(r: torch.Tensor, x: int, q: torch.Tensor | None) -> torch.Tensor:
    """norm(max(0, r - q)); q None is the point mass on x. A rejection is possible only where r
    puts less mass than q somewhere, so the difference has positive mass."""
    if q is None:
        r = r.clone()
        r[x] = 0
    else:
        r = (r - q).clamp_(min=0)
    total = r.sum()
    if not total > 0:
        raise FloatingPointError(f"residual distribution has no mass after rejecting token {x}")
    return r / total
