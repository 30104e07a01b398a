"""Suffix decoding (training-free), after SuffixDecoding (Oliaro et al.), without arctic-inference.

A depth-bounded suffix trie counts every substring of length <= max_tree_depth of the
request's prompt plus its generated history (and, optionally, of earlier requests' outputs: the
global cache). To propose, match a suffix of the context of length p, then grow a *tree* of
likely continuations from the matched node, best-first by cumulative frequency probability:

    prob(child) = count(child) / sum(count(siblings))     cum(node) = prod of prob on its path

Limits, as in vLLM's suffix method: p + depth of the speculation <= max_tree_depth; at most
min(draft_len, max_spec_factor * p) nodes; nodes with cum < min_token_prob are dropped. Of the
candidate trees for every match length (and for both tries) the one with the highest expected
accepted length (sum of cum) wins. The tree is verified in one target forward.
"""
from __future__ import annotations

import heapq
import json
import os
from collections import deque
from dataclasses import dataclass

from ..core.loop import Draft, StepResult
from ..data.records import write_json
from . import VllmServing


class _Node:
    __slots__ = ("count", "children", "depth")

    def __init__(self, depth: int):
        self.count = 0
        self.children: dict[int, _Node] = {}
        self.depth = depth


class SuffixTrie:
    """Counts of every substring of length <= depth of the sequences fed to it."""

    def __init__(self, depth: int):
        self.depth = depth
        self.root = _Node(0)

    def start_sequence(self) -> list:
        return []  # active nodes: the windows that may still grow

    def append(self, active: list, token: int) -> list:
        grown = []
        for node in active + [self.root]:  # every window ending at the last token, plus a new one
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node(node.depth + 1)
            child.count += 1
            if child.depth < self.depth:
                grown.append(child)
        return grown

    def add(self, tokens: list[int]) -> None:
        active = self.start_sequence()
        for t in tokens:
            active = self.append(active, t)

    def remove(self, tokens: list[int]) -> None:
        """Undo add(tokens) (global-cache eviction)."""
        for i in range(len(tokens)):
            node = self.root
            for t in tokens[i: i + self.depth]:
                child = node.children[t]
                child.count -= 1
                if child.count == 0:
                    del node.children[t]
                    break
                node = child

    def find(self, pattern: list[int]) -> _Node | None:
        node = self.root
        for t in pattern:
            node = node.children.get(t)
            if node is None:
                return None
        return node


@dataclass
class SuffixConfig:
    draft_len: int = 8               # most draft nodes per step
    max_tree_depth: int = 8          # bound on match length + speculation depth
    max_spec_factor: float = 1.0     # at most factor x match length nodes
    min_token_prob: float = 0.0      # drop nodes whose cumulative probability is lower
    global_cache: bool = False       # also speculate from earlier requests' outputs
    max_cached_requests: int = 1000  # bound on the global cache (oldest evicted first)
    cache_path: str | None = None    # persist the global cache here (loaded if it exists)

    def __post_init__(self):
        if self.max_tree_depth < 2:
            raise ValueError(f"suffix: max_tree_depth must be >= 2, got {self.max_tree_depth}")
        if self.draft_len < 1 or self.max_spec_factor <= 0 or not 0 <= self.min_token_prob <= 1:
            raise ValueError(f"suffix: bad limits draft_len={self.draft_len}, "
                             f"max_spec_factor={self.max_spec_factor}, min_token_prob={self.min_token_prob}")
        if self.max_cached_requests < 1:
            raise ValueError(f"suffix: max_cached_requests must be >= 1, got {self.max_cached_requests}")


def speculate(node: _Node, budget: int, max_depth: int, min_prob: float) -> tuple[Draft, float]:
    """Best-first tree of at most `budget` nodes below `node`; returns it and its score."""
    tokens, parents, score = [], [], 0.0
    heap, tie = [], 0

    def push(n: _Node, parent: int, cum: float) -> None:
        nonlocal tie
        total = sum(c.count for c in n.children.values())
        for tok, c in n.children.items():
            p = cum * c.count / total
            if p >= min_prob and c.depth <= max_depth:
                heapq.heappush(heap, (-p, tie, tok, c, parent))
                tie += 1

    push(node, -1, 1.0)
    while heap and len(tokens) < budget:
        neg_p, _, tok, c, parent = heapq.heappop(heap)
        tokens.append(tok)
        parents.append(parent)
        score -= neg_p
        push(c, len(tokens) - 1, -neg_p)
    return Draft(tokens, parents), score


class SuffixCache:
    """Global cache: earlier requests' outputs in one trie, bounded, persisted as JSON."""

    def __init__(self, depth: int, max_requests: int, path: str | None):
        self.trie = SuffixTrie(depth)
        self.max_requests, self.path = max_requests, path
        self.requests: deque[list[int]] = deque()
        if path and os.path.exists(path):
            try:
                with open(path) as f:
                    saved = json.load(f)
                stored = saved["requests"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}: not a suffix cache file ({e})") from e
            for tokens in stored[-max_requests:]:
                self.add(tokens)

    def add(self, tokens: list[int]) -> None:
        if not tokens:
            return
        self.requests.append(list(tokens))
        self.trie.add(tokens)
        while len(self.requests) > self.max_requests:
            self.trie.remove(self.requests.popleft())

    def save(self) -> None:
        if not self.path:
            return
        write_json(self.path, {"depth": self.trie.depth, "requests": list(self.requests)})


class SuffixProposer:
    tap_layers = ()
    drafts_from_prompt = True  # no target state needed: the first step verifies a draft

    def __init__(self, cfg: SuffixConfig):
        self.cfg = cfg
        self.draft_shape = f"tree <={cfg.draft_len} nodes"
        self.cache = SuffixCache(cfg.max_tree_depth, cfg.max_cached_requests, cfg.cache_path) \
            if cfg.global_cache else None
        self.local: SuffixTrie | None = None
        self.prompt_len = 0
        self.ids: list[int] = []

    def _finish_request(self) -> None:
        if self.cache is not None and self.local is not None:
            self.cache.add(self.ids[self.prompt_len:])

    def start(self, prompt_ids, hidden=None, sampler=None) -> None:
        # drafts are continuations seen before: point masses, lossless under sampling too
        self._finish_request()
        self.local = SuffixTrie(self.cfg.max_tree_depth)
        self.active = self.local.start_sequence()
        self.ids, self.fed, self.prompt_len = [], 0, len(prompt_ids)

    def propose(self, ids: list[int], max_depth: int | None = None) -> Draft | None:
        # the scored tree is built whole (cheap); the loop prunes nodes past max_depth
        self.ids = ids
        for t in ids[self.fed:]:  # feed the history into the request's own trie
            self.active = self.local.append(self.active, t)
        self.fed = len(ids)
        cfg = self.cfg
        best, best_score = None, 0.0
        tries = [self.local] + ([self.cache.trie] if self.cache is not None else [])
        for p in range(min(cfg.max_tree_depth - 1, len(ids)), 0, -1):
            budget = min(cfg.draft_len, int(cfg.max_spec_factor * p))
            if budget < 1:
                continue
            for trie in tries:
                node = trie.find(ids[-p:])
                if node is None or not node.children:
                    continue
                draft, score = speculate(node, budget, cfg.max_tree_depth, cfg.min_token_prob)
                if score > best_score:
                    best, best_score = draft, score
        return best if best is not None and len(best) else None

    def observe(self, step: StepResult) -> None:
        pass

    def close(self) -> None:
        """End of the run: the last request joins the global cache, which is saved."""
        self._finish_request()
        self.local = None
        if self.cache is not None:
            self.cache.save()


NAME = "suffix"
PARAMS = SuffixConfig
EXAMPLE = {"params": {"draft_len": 6, "max_tree_depth": 6}}
VLLM = VllmServing(tree=True, hook=True)


def vllm_config(p: SuffixConfig, export_dir=None) -> dict:
    # vLLM's suffix method runs Arctic Inference's suffix tree (the arctic-inference package). Its
    # global cache of earlier responses is on by default; 0 cached requests turns it off, as our
    # global_cache=False does (a benchmark's repeated rounds would otherwise draft from their own
    # earlier outputs)
    return {"method": "suffix", "num_speculative_tokens": p.draft_len,
            "suffix_decoding_max_tree_depth": p.max_tree_depth,
            "suffix_decoding_max_spec_factor": p.max_spec_factor,
            "suffix_decoding_min_token_prob": p.min_token_prob,
            "suffix_decoding_max_cached_requests": p.max_cached_requests if p.global_cache else 0}


def build(params: dict, target=None) -> SuffixProposer:
    return SuffixProposer(SuffixConfig(**params))


def tuning_grid(p: SuffixConfig) -> dict:
    # the most tree nodes per step; the depth bound stays the variant's
    return {"draft_len": [4, 8, 12, 16]}
