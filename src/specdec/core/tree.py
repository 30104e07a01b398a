"""Draft trees: token nodes with parent indices -> attention mask and position ids.

A draft is a tree rooted at the *pending* token (the last committed token, whose KV is not in
the cache yet). Node 0 is that root; every other node i has parents[i] < i. A chain is the tree
with parents [-1, 0, 1, ...]. Node i may attend to every cached token, to its ancestors and to
itself; its position is cached_len + depth(i).
"""
from __future__ import annotations

import torch


def check_parents(parents: list[int]) -> None:
    if not parents or parents[0] != -1:
        raise ValueError(f"a draft tree needs the root first with parent -1, got {parents[:4]}")
    for i, p in enumerate(parents[1:], start=1):
        if not 0 <= p < i:
            raise ValueError(f"node {i} has parent {p}: parents must come before their children")


def is_chain(parents: list[int]) -> bool:
    return all(p == i - 1 for i, p in enumerate(parents))


def depths(parents: list[int]) -> list[int]:
    d = [0] * len(parents)
    for i in range(1, len(parents)):
        d[i] = d[parents[i]] + 1
    return d


def ancestor_matrix(parents: list[int]) -> torch.Tensor:
    """visible[i, j] is True when node j is node i or one of its ancestors (parent -1: a root;
    several roots make a forest)."""
    n = len(parents)
    visible = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        if parents[i] >= 0:
            visible[i] = visible[parents[i]]  # a node sees what its parent sees ...
        visible[i, i] = True  # ... and itself
    return visible


def tree_attention_inputs(parents: list[int], cached_len: int, dtype: torch.dtype,
                          device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Additive 4-D mask (1, 1, n, cached_len + n) and position ids (1, n) for a tree forward."""
    n = len(parents)
    visible = torch.ones(n, cached_len + n, dtype=torch.bool)
    visible[:, cached_len:] = ancestor_matrix(parents)
    mask = torch.zeros(n, cached_len + n, dtype=dtype)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)  # 0 where attending is allowed
    positions = torch.tensor(depths(parents), dtype=torch.long) + cached_len
    return mask[None, None].to(device), positions[None].to(device)


def root_paths(parents: list[int]) -> list[list[int]]:
    """Every root-to-leaf path as node indices (used by brute-force checks)."""
    children = {i for i in parents if i >= 0}
    paths = []
    for leaf in range(len(parents)):
        if leaf in children:
            continue
        path, node = [], leaf
        while node != -1:
            path.append(node)
            node = parents[node]
        paths.append(path[::-1])
    return paths
