"""Our own proposers inside vLLM's scheduler, through its custom proposer hook
(vllm/v1/spec_decode/custom_class_proposer.py): speculative_config
{"method": "custom_class", "model": "specdec.backends.vllm_hook.SpecdecProposer"}.

What the hook carries, and so which methods it can serve (registry: VllmServing.hook):
- vLLM builds the class from its VllmConfig alone, so the method and its parameters travel in the
  environment (SPECDEC_VLLM_PROPOSER, JSON), set by bench_vllm before the engine starts.
- Each step vLLM passes, per batch row, the tokens so far (prompt plus accepted output) and takes
  a list of draft tokens back: a chain. No hidden states, no draft distributions, no request ids.
  Proposers that need only the token ids (n-gram, suffix) fit; the learned ones, which draft from
  the target's hidden states, do not. A tree proposer (our suffix) gives its most likely path:
  every node's first child is its most probable one (best-first order).
- vLLM verifies the chain with its own rejection sampler, so under sampling the drafts are point
  masses, as they are in our loop.
Requests move between batch rows as others finish, so a row's proposer is found by its token
history: the state whose ids are a prefix of the row's ids continues; otherwise a new one starts.
"""
from __future__ import annotations

import json
import os

from .. import methods

ENV = "SPECDEC_VLLM_PROPOSER"
CLASS_PATH = "specdec.backends.vllm_hook.SpecdecProposer"


def speculative_config(method: str, params: dict) -> dict:
    """vLLM's speculative_config that serves our `method` through the hook; sets ENV for the
    engine this process builds next."""
    serving = methods.vllm_serving(method)
    if serving is None or not serving.hook:
        raise ValueError(f"method {method!r} cannot run inside vLLM's custom proposer hook: it drafts "
                         "from the target's hidden states, which the hook does not pass")
    native = methods.vllm_config(method, params)
    os.environ[ENV] = json.dumps({"method": method, "params": params})
    return {"method": "custom_class", "model": CLASS_PATH,
            "num_speculative_tokens": native["num_speculative_tokens"]}


def best_path(tokens: list[int], parents: list[int]) -> list[int]:
    """A draft tree's first-child path from the root: the chain the hook can carry."""
    chain, at = [], -1
    for i, (token, parent) in enumerate(zip(tokens, parents)):
        if parent == at:
            chain.append(token)
            at = i
    return chain


class _Request:
    __slots__ = ("proposer", "ids")

    def __init__(self, proposer, ids: list[int]):
        self.proposer, self.ids = proposer, ids


class SpecdecProposer:
    def __init__(self, vllm_config):
        spec = json.loads(os.environ[ENV])
        self.method, self.params = spec["method"], spec["params"]
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.rows: dict[int, _Request] = {}

    def _request(self, row: int, ids: list[int], free: list[_Request]) -> _Request:
        """The state that continues this row's request, or a new one."""
        def continues(r):
            return len(r.ids) <= len(ids) and ids[: len(r.ids)] == r.ids
        mine = self.rows.get(row)
        if mine is not None and mine in free and continues(mine):
            free.remove(mine)
            return mine
        for r in free:
            if continues(r):
                free.remove(r)
                return r
        proposer = methods.build_proposer(self.method, self.params)
        proposer.start(ids)
        return _Request(proposer, [])

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None,
                **_) -> list[list[int]]:
        free = list(self.rows.values())
        rows, drafts = {}, []
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            if not len(sampled) or n >= self.max_model_len:   # as vLLM's n-gram proposer: skip
                drafts.append([])
                continue
            ids = token_ids_cpu[i, :n].tolist()
            req = rows[i] = self._request(i, ids, free)
            req.ids = ids
            draft = req.proposer.propose(ids, max_depth=self.k)
            drafts.append([] if draft is None else best_path(draft.tokens, draft.parents)[: self.k])
        self.rows = rows
        return drafts

    def load_model(self, *args, **kwargs) -> None:
        pass   # no weights: the proposer reads token ids only
