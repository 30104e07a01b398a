"""Medusa-1: K future-token heads on the frozen target's last (post-norm) hidden state: the
target's final norm applied to tap num_layers (core.target: the taps are before that norm), in
training and decoding alike, which is the state vLLM's Llama/Qwen2 target hands its Medusa heads.

Head k (1..K) reads h_t, the state from which the target predicts token t+1, and predicts token
t+1+k:   logits_k = W_k (h_t + SiLU(A_k h_t + b_k)),   W_k initialised from the target's lm_head,
A_k from zero (so every head starts as the target's own next-token head).
Loss (Medusa-1, frozen backbone): sum_k decay^(k-1) * CE(logits_k, token t+1+k), over positions
whose label is one of the target's greedy completion tokens (distillation); with soft labels, the
CE to the target's top-K distribution at t+1+k instead (train/soft.py).

Inference drafts a tree of top-k candidates in one shot: a node at depth d is the r-th ranked
token of head d. The tree's shape comes from measured accuracies, not from a constant: with
p[k][r] = P(label of head k is its r-th ranked token) on a calibration split, a node's expected
acceptance is the product of p along its path (Medusa's independence assumption), and the tree is
the `max_tree_nodes` nodes of highest expected acceptance (best-first; a child never scores above
its parent, so the chosen set always contains every chosen node's ancestors).

Optionally (`draft_vocab_size`) the heads' LM heads cover only the most frequent training tokens
(rows copied from the target's): on a CPU, where K full 49k-row heads cost a third of a decode
step, this makes drafting ~6x cheaper; the target still verifies over its full vocabulary.
"""
from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..core.loop import Draft, StepResult
from ..train.checkpoint import load_proposer, save_trained, write_model_dir
from ..train.soft import soft_cross_entropy, to_drafter
from ..train.vocab import coverage, frequent_tokens, target_to_draft
from . import VllmServing

NAME = "medusa"


@dataclass
class MedusaTrainConfig:
    num_heads: int = 4
    loss_decay: float = 0.8       # weight of head k is loss_decay^(k-1)
    calibration: str = "train"    # split whose per-rank head accuracies shape the tree
    max_rank: int = 10            # ranks whose accuracy is measured (>= any tree_topk used)
    # the train split's rank accuracies from a seeded sample of this many positions (None: all);
    # 16,384 estimate each accuracy to within about +-0.4% (one standard error at p = 0.3)
    calibration_positions: int | None = 16384
    train_lm_head: bool = True    # False: every head keeps the target's LM head (frozen, shared)
    draft_vocab_size: int | None = None  # heads over the N most frequent training tokens (None: all)


class MedusaHeads(nn.Module):
    """`draft_vocab` (target ids, ascending) restricts the LM heads to those rows; head outputs
    are then indices into it."""

    def __init__(self, num_heads: int, hidden_size: int, vocab_size: int, draft_vocab: torch.Tensor | None = None):
        super().__init__()
        rows = vocab_size if draft_vocab is None else len(draft_vocab)
        self.res = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_heads))
        self.lm_heads = nn.ModuleList(nn.Linear(hidden_size, rows, bias=False) for _ in range(num_heads))
        if draft_vocab is not None:
            self.register_buffer("draft_vocab", draft_vocab.clone())
        else:
            self.draft_vocab = None

    def init_from_target(self, lm_head_weight: torch.Tensor) -> None:
        rows = lm_head_weight if self.draft_vocab is None else lm_head_weight[self.draft_vocab]
        for res, head in zip(self.res, self.lm_heads):
            nn.init.zeros_(res.weight)
            nn.init.zeros_(res.bias)
            head.weight.data.copy_(rows)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h (..., hidden) -> logits (K, ..., vocab)."""
        return torch.stack([head(h + F.silu(res(h))) for res, head in zip(self.res, self.lm_heads)])


# ---- training ---------------------------------------------------------------------------------
def head_examples(seqs, tap: int, norm: nn.Module, num_heads: int):
    """(post-norm h_t, labels (t+2 .. t+1+K), soft labels or None) for every position t whose next
    token is a completion token: the target's tokens there (Sequence.labels; past the end, -100),
    and where the sequences carry them, its top-K there ((N, K, topk) ids (-1 past the end), logp)."""
    xs, ys, sids, slps = [], [], [], []
    for s in seqs:
        n, p = len(s.ids), s.prompt_len
        t = torch.arange(p - 1, n - 1)  # h_t predicts a completion token at t+1
        if len(t) == 0:
            continue
        with torch.no_grad():
            xs.append(norm(s.taps[tap][t].float()))
        lab = torch.full((len(t), num_heads), -100, dtype=torch.long)
        targets = s.targets                 # the target's token at each completion position
        soft = s.soft_targets
        if soft is not None:
            sid = torch.full((len(t), num_heads, soft[0].shape[1]), -1, dtype=torch.int32)
            slp = torch.full(sid.shape, float("-inf"))
        for k in range(1, num_heads + 1):
            j = t + 1 + k
            ok = j < n
            lab[ok, k - 1] = targets[j[ok]]
            if soft is not None:
                sid[ok, k - 1], slp[ok, k - 1] = soft[0][j[ok]], soft[1][j[ok]]
        ys.append(lab)
        if soft is not None:
            sids.append(sid)
            slps.append(slp)
    return torch.cat(xs), torch.cat(ys), (torch.cat(sids), torch.cat(slps)) if sids else None


def medusa_loss(logits: torch.Tensor, labels: torch.Tensor, decay: float,
                soft: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, list[float]]:
    """logits (K, N, V), labels (N, K) -> weighted CE and top-1 accuracy per head. Labels < 0
    (past the end, in the prompt, or outside the draft vocabulary) are left out. soft: ((N, K,
    topk) draft indices, logp): the CE to the target's top-K distribution instead."""
    total, accs = logits.new_zeros(()), []
    for k in range(logits.shape[0]):
        y = labels[:, k]
        valid = y >= 0
        if valid.any():
            ce = (F.cross_entropy(logits[k][valid], y[valid]) if soft is None
                  else soft_cross_entropy(logits[k][valid], soft[0][valid, k], soft[1][valid, k]))
            total = total + decay ** k * ce
            accs.append((logits[k][valid].argmax(-1) == y[valid]).float().mean().item())
        else:
            accs.append(float("nan"))
    return total, accs


@torch.no_grad()
def rank_accuracy(heads: MedusaHeads, x: torch.Tensor, y: torch.Tensor, max_rank: int,
                  chunk: int = 512) -> list[list[float]]:
    """p[k][r] = fraction of positions whose head-k label is exactly head k's r-th ranked token
    (labels are draft indices; -1, outside the draft vocabulary, counts as a miss)."""
    K = len(heads.res)
    hits = torch.zeros(K, max_rank, device=x.device)
    count = torch.zeros(K, device=x.device)
    for a in range(0, len(x), chunk):
        logits = heads(x[a:a + chunk])
        top = logits.topk(max_rank, dim=-1).indices  # (K, n, R)
        for k in range(K):
            lab = y[a:a + chunk, k]
            valid = lab != -100
            hits[k] += (top[k][valid] == lab[valid, None]).float().sum(0)
            count[k] += valid.sum()
    return (hits / count.clamp(min=1)[:, None]).tolist()


def calibration_sample(n: int, k: int | None) -> torch.Tensor:
    """Indices of k of n positions (seeded, ascending); all of them when k is None or >= n."""
    if k is None or k >= n:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(0))[:k].sort().values


TRAIN_SETTINGS = {"medusa": MedusaTrainConfig}
EXAMPLES = "positions"   # a training batch draws single positions, not records (setup)


def hidden_taps(config, settings: dict) -> list[int]:
    return [config.num_hidden_layers]   # the last layer's state (pre-norm; the heads read norm(tap))


def setup(target, data, settings: dict, tcfg, device: str):
    """Examples are positions: (post-norm state, the K labels ahead); the heads start as copies
    of the target's LM head."""
    from ..train.driver import Trainee
    mcfg = MedusaTrainConfig(**settings.get("medusa", {}))
    if mcfg.calibration not in ("train", "overlap", "heldout"):
        raise ValueError(f"medusa.calibration must be train, overlap or heldout, not {mcfg.calibration!r}")
    tap, norm, V = target.config.num_hidden_layers, target.model.norm, target.config.vocab_size
    vocab = None if mcfg.draft_vocab_size is None else frequent_tokens(data.train, mcfg.draft_vocab_size, V)
    t2d = torch.arange(V) if vocab is None else target_to_draft(vocab, V)
    dtype = getattr(torch, tcfg.dtype)

    def examples(seqs):  # labels as draft indices (-1: not in the draft vocabulary)
        ex, ey, soft = head_examples(seqs, tap, norm, mcfg.num_heads)
        return ex.to(device, dtype), torch.where(ey >= 0, t2d[ey.clamp(min=0)], ey).to(device), soft

    x, y, soft = examples(data.train)
    if soft is not None:   # the top-K as draft indices
        soft = (to_drafter(soft[0], t2d).to(device), soft[1].to(device))
    heads = MedusaHeads(mcfg.num_heads, target.config.hidden_size, V, vocab)
    heads.init_from_target(target.lm_head.weight.detach())
    if not mcfg.train_lm_head:
        for head in heads.lm_heads:
            head.weight.requires_grad_(False)
    heads.to(device, dtype)

    def loss(module, idx, step):
        value, accs = medusa_loss(module(x[idx]).float(), y[idx], mcfg.loss_decay,
                                  None if soft is None else (soft[0][idx], soft[1][idx]))
        return value, {f"acc_head{k + 1}": acc for k, acc in enumerate(accs)}

    evals = {name: examples(seqs)[:2] for name, seqs in data.eval_splits().items()}
    cal = calibration_sample(len(x), mcfg.calibration_positions)
    rank_acc = {}   # split -> per-head, per-rank accuracy; the calibration split's shapes the tree

    def evaluate(module):   # the eval proxy (during training and at the end): the eval splits only
        for name, (ex, ey) in evals.items():
            rank_acc[name] = rank_accuracy(module, ex, ey, mcfg.max_rank)
        return {name: {"top1_accuracy_per_head": [r[0] for r in rank_acc[name]],
                       "top5_accuracy_per_head": [sum(r[:5]) for r in rank_acc[name]]} for name in evals}

    vocab_info = None if vocab is None else {
        "size": len(vocab), "train_label_coverage": coverage(data.train, vocab, V),
        "heldout_label_coverage": coverage(data.heldout, vocab, V)}

    def save(out_dir, train_config, log, eval_proxy):
        if mcfg.calibration == "train":   # once, on the trained heads: a sample of train positions
            rank_acc["train"] = rank_accuracy(heads, x[cal], y[cal], mcfg.max_rank)
        state = {k: v if k == "draft_vocab" else v.float() for k, v in heads.state_dict().items()}
        save_trained(out_dir, NAME, asdict(mcfg), state, target.config, train_config, log, eval_proxy,
                     extra={"rank_accuracy": rank_acc, "calibration": mcfg.calibration, "draft_vocab": vocab_info})

    return Trainee(heads, len(x), loss, evaluate, save, asdict(mcfg),
                   f"{mcfg.num_heads} heads, draft vocabulary {vocab_info or 'full'}")


def load_module(ckpt_dir: str, model) -> MedusaHeads:
    meta, state = load_proposer(ckpt_dir, NAME, model.config)
    heads = MedusaHeads(meta["config"]["num_heads"], model.config.hidden_size, model.config.vocab_size,
                        state.get("draft_vocab"))
    heads.load_state_dict(state)
    return heads


# ---- the tree ---------------------------------------------------------------------------------
def choose_tree(rank_acc: list[list[float]], draft_len: int, tree_topk: int,
                max_tree_nodes: int) -> tuple[list[tuple[int, ...]], float]:
    """Best-first selection of rank paths by expected acceptance (product of per-head rank
    accuracies). Returns the chosen paths in selection order (parents before children) and the
    expected number of accepted draft tokens per step (the sum of their scores)."""
    depth_max = min(draft_len, len(rank_acc))
    if depth_max < 1 or tree_topk < 1 or max_tree_nodes < 1:
        raise ValueError("medusa tree needs draft_len, tree_topk and max_tree_nodes >= 1")
    if tree_topk > len(rank_acc[0]):
        raise ValueError(f"tree_topk {tree_topk} > ranks measured in the checkpoint ({len(rank_acc[0])})")
    heap = [(-rank_acc[0][r], (r,)) for r in range(tree_topk)]
    heapq.heapify(heap)
    chosen, expected = [], 0.0
    while heap and len(chosen) < max_tree_nodes:
        neg, path = heapq.heappop(heap)
        chosen.append(path)
        expected += -neg
        if len(path) < depth_max:
            for r in range(tree_topk):
                heapq.heappush(heap, (neg * rank_acc[len(path)][r], path + (r,)))
    return chosen, expected


def tree_template(paths: list[tuple[int, ...]]) -> tuple[list[int], list[int], list[int]]:
    """Rank paths -> (depth-1 head index, rank, parent) per node; parent -1 is the pending token."""
    index = {p: i for i, p in enumerate(paths)}
    heads = [len(p) - 1 for p in paths]
    ranks = [p[-1] for p in paths]
    parents = [index[p[:-1]] if len(p) > 1 else -1 for p in paths]
    return heads, ranks, parents


# ---- inference --------------------------------------------------------------------------------
@dataclass
class MedusaConfig:
    checkpoint: str
    draft_len: int = 4
    tree_topk: int = 5
    max_tree_nodes: int = 31


class MedusaProposer:
    drafts_from_prompt = False  # drafts from the target's hidden states: needs the prefill first

    def __init__(self, cfg: MedusaConfig, target):
        self.cfg = cfg
        meta, state = load_proposer(cfg.checkpoint, NAME, target.config)
        K = meta["config"]["num_heads"]
        dtype, device = target.dtype, target.device
        self.norm = target.model.model.norm
        self.tap_layers = (target.num_layers,)
        # the K heads as stacked tensors: one batched matmul per step instead of K
        self.res_w = torch.stack([state[f"res.{k}.weight"] for k in range(K)]).to(device, dtype)
        self.res_b = torch.stack([state[f"res.{k}.bias"] for k in range(K)]).to(device, dtype)
        self.lm_w = torch.stack([state[f"lm_heads.{k}.weight"] for k in range(K)]).to(device, dtype)
        vocab = state.get("draft_vocab")  # head output index -> target token id
        self.vocab = None if vocab is None else vocab.to(device)
        rank_acc = meta["rank_accuracy"][meta["calibration"]]
        paths, self.expected_accepted = choose_tree(rank_acc, cfg.draft_len, cfg.tree_topk, cfg.max_tree_nodes)
        self.node_head, self.node_rank, self.parents = tree_template(paths)
        self.depth = max(self.node_head) + 1
        self._head = torch.tensor(self.node_head, device=device)
        self._rank = torch.tensor(self.node_rank, device=device)
        vocab_note = "" if vocab is None else f", draft vocab {len(vocab)}"
        self.draft_shape = (f"tree {len(paths)} nodes, depth {self.depth}, top-{cfg.tree_topk}{vocab_note}, "
                            f"expected {self.expected_accepted:.2f} accepted/step ({meta['calibration']} calibration)")
        self._h = None

    def start(self, prompt_ids, hidden, sampler=None) -> None:
        # the tree holds each head's top-k tokens at any temperature: point masses for the verifier
        self._h = self.norm(hidden[self.tap_layers[0]][-1])

    def observe(self, step: StepResult) -> None:
        self._h = self.norm(step.hidden[self.tap_layers[0]][-1])  # state of the last accepted node

    def propose(self, ids: list[int], max_depth: int | None = None) -> Draft | None:
        # the static tree whole; the loop prunes nodes past max_depth
        h = self._h[None, :]                                        # (1, H)
        r = h + F.silu(torch.baddbmm(self.res_b[:, None], h.expand(len(self.res_w), 1, -1),
                                     self.res_w.transpose(1, 2)))  # (K, 1, H)
        logits = torch.bmm(r[: self.depth], self.lm_w[: self.depth].transpose(1, 2))[:, 0]  # (depth, V)
        top = logits.topk(self.cfg.tree_topk, dim=-1).indices       # (depth, topk)
        picked = top[self._head, self._rank]                       # node -> its head's ranked token
        tokens = (picked if self.vocab is None else self.vocab[picked]).tolist()
        return Draft(tokens, self.parents)


PARAMS = MedusaConfig
EXAMPLE = {"params": {"draft_len": 3, "tree_topk": 2, "max_tree_nodes": 6},
           "train": {"train": {"steps": 6, "batch_size": 16, "save_every": 3},
                     "medusa": {"num_heads": 3, "draft_vocab_size": 48}}}
# vLLM drafts Medusa as a chain: head k's top-1 token at depth k (vllm/v1/spec_decode/medusa.py)
VLLM = VllmServing(export="draft")


def vllm_config(p: MedusaConfig, export_dir: str) -> dict:
    import json
    from pathlib import Path

    heads = json.loads((Path(export_dir) / "config.json").read_text())["num_heads"]
    if p.draft_len != heads:
        raise ValueError(f"medusa: vLLM drafts one token per head, so draft_len must equal the export's "
                         f"{heads} heads, got {p.draft_len}")
    return {"method": "medusa", "model": str(export_dir), "num_speculative_tokens": heads}


def export_vllm(ckpt_dir: str, target_dir: str, out_dir: str) -> None:
    """Write vLLM's Medusa draft directory (vllm/model_executor/models/medusa.py): head k is
    `blocks.k.layers.0` (x + SiLU(W x + b), the residual block we train) and `lm_heads.k`.
    vLLM reads the same post-norm state our heads read. A reduced draft vocabulary is written as
    full-vocabulary LM heads whose other rows are zero: vLLM's own `token_map` path only works with
    one shared LM head (its per-head LM heads keep the full vocabulary size, so a truncated weight
    does not load). A zero row scores 0, so vLLM's top-1 is our head's wherever our best logit is
    positive (true of a trained head's top logit in practice; tests/test_vllm_export.py checks it)."""
    from transformers import AutoConfig

    tcfg = AutoConfig.from_pretrained(target_dir)
    meta, state = load_proposer(ckpt_dir, NAME, tcfg)
    K, V, H = meta["config"]["num_heads"], tcfg.vocab_size, tcfg.hidden_size
    dtype = getattr(tcfg, "dtype", None) or torch.float32
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    vocab = state.get("draft_vocab")
    weights = {}
    for k in range(K):
        weights[f"blocks.{k}.layers.0.weight"] = state[f"res.{k}.weight"].to(dtype)
        weights[f"blocks.{k}.layers.0.bias"] = state[f"res.{k}.bias"].to(dtype)
        head = state[f"lm_heads.{k}.weight"]
        if vocab is not None:   # draft index i -> row vocab[i] of a full-vocabulary head
            full = torch.zeros(V, H, dtype=head.dtype)
            full[vocab] = head
            head = full
        weights[f"lm_heads.{k}.weight"] = head.to(dtype)
    config = {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": H, "vocab_size": V,
              "num_heads": K, "num_hidden_layers": 1, "medusa_fc_bias": True, "truncated_vocab_size": V,
              "dtype": str(dtype).removeprefix("torch.")}
    write_model_dir(out_dir, weights, config,
                    {"method": NAME, "export": "vllm MedusaModel", "checkpoint": str(ckpt_dir),
                     "target": str(target_dir), "num_heads": K,
                     "draft_vocab": None if vocab is None else len(vocab)})


def build(params: dict, target) -> MedusaProposer:
    return MedusaProposer(MedusaConfig(**params), target)


def tuning_grid(p: MedusaConfig) -> dict:
    # a tree: its node budget (drafting costs the same); a chain: its depth, at most one per head
    if p.tree_topk > 1:
        return {"max_tree_nodes": [6, 10, 16, 24]}
    return {"draft_len": [1, 2, 3, 4]}
