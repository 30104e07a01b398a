"""EAGLE-3: a one-layer drafter on the fusion of low, mid and high target hidden states, trained
with training-time test (TTT), drafting a chain or an EAGLE-2 dynamic tree.

The drafter (the layout and names of vLLM's llama_eagle3.py, so the export is a rename):
    f_j   = fc[ h_j^low ; h_j^mid ; h_j^high ]                 fused target state of position j
    x     = [ input_layernorm(E x_(j+1)) ; hidden_norm(g) ]    2H input: next token + state g
    r     = g + Attn(x)          o = r + MLP(post_attention_layernorm(r))
    logits of token j+2 = lm_head(norm(o)),  and o (pre-norm) is the state g of the next step.
Row j reads g = f_j at the first step; drafting further, each row reads the output o of the row
before it (the drafter's own state, never the target's). E and the rotary embedding are the
target's; lm_head may cover only the most frequent training tokens (vLLM's `d2t` offsets map
draft index i to target id i + d2t[i]).

Training-time test: the drafter is unrolled for `ttt_steps` over whole sequences. At step s,
row j stands for the draft at position j+s: it reads o of row j at step s-1 and the true token
x_(j+s+1), predicts x_(j+s+2), and attends to the step-0 keys of positions <= j (the verified
context) plus its own keys of steps 1..s (a diagonal block per step): what the drafter sees at
inference after s own steps. Loss: sum_s loss_decay^s * CE over completion-token labels (with soft
labels, the CE to the target's top-K distribution there, train/soft.py).

Inference keeps the drafter's KV cache exact: only rows of verified positions, computed from the
target's features and the verified tokens, stay in it; every row a draft depends on is cropped
after drafting, and the next step runs the newly verified positions in one forward.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache

from ..core.loop import Draft, StepResult, draft_limit
from ..core.target import new_cache, one_layer_config
from ..core.tree import ancestor_matrix, tree_attention_inputs
from ..train.checkpoint import load_proposer, save_trained, write_model_dir
from ..train.driver import frozen_target
from ..train.soft import padded_soft, soft_cross_entropy, to_drafter
from ..train.vocab import coverage, frequent_tokens
from . import VllmServing

NAME = "eagle3"


def default_taps(num_layers: int) -> list[int]:
    """vLLM's default EAGLE-3 layers for Llama targets: low, mid, high (HF hidden_states ids)."""
    return [2, num_layers // 2, num_layers - 3]


class Eagle3Drafter(nn.Module):
    def __init__(self, config, taps: list[int], draft_vocab: torch.Tensor, block_cls, norm_cls):
        super().__init__()
        H = config.hidden_size
        self.taps = list(taps)
        self.layer_config = one_layer_config(config)
        self.fc = nn.Linear(len(taps) * H, H, bias=False)
        self.midlayer = block_cls(self.layer_config, layer_idx=0)
        attn = self.midlayer.self_attn
        for name in ("q_proj", "k_proj", "v_proj"):  # attention reads [embedding ; state]: 2H wide
            old = getattr(attn, name)
            setattr(attn, name, nn.Linear(2 * H, old.out_features, bias=old.bias is not None))
        self.midlayer.hidden_norm = norm_cls(H, eps=config.rms_norm_eps)
        self.norm = norm_cls(H, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(H, len(draft_vocab), bias=False)
        self.register_buffer("draft_vocab", draft_vocab.clone())  # draft index -> target id

    @classmethod
    def for_target(cls, model, taps: list[int], draft_vocab: torch.Tensor) -> Eagle3Drafter:
        base = model.model
        return cls(model.config, taps, draft_vocab, type(base.layers[0]), type(base.norm))

    def init_from_target(self, model) -> None:
        """Layer from the target's last decoder layer (q/k/v read the sum of both halves), fc
        passes the highest tap through, norm and lm_head rows from the target's."""
        state = dict(model.model.layers[-1].state_dict())
        for name in ("q_proj", "k_proj", "v_proj"):
            w = state[f"self_attn.{name}.weight"]
            state[f"self_attn.{name}.weight"] = torch.cat([w, w], dim=1)
        state["hidden_norm.weight"] = state["input_layernorm.weight"]
        self.midlayer.load_state_dict(state)
        H = self.fc.out_features
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.weight[:, -H:] = torch.eye(H)
            self.norm.load_state_dict(model.model.norm.state_dict())
            self.lm_head.weight.copy_(model.lm_head.weight[self.draft_vocab])

    def forward(self, g, emb, position_ids, position_embeddings, attention_mask, cache=None):
        """g (B, n, H) states, emb (B, n, H) next-token embeddings -> (o, norm(o))."""
        layer = self.midlayer
        x = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(g)], dim=-1)
        a, _ = layer.self_attn(hidden_states=x, position_embeddings=position_embeddings,
                               attention_mask=attention_mask, position_ids=position_ids, past_key_values=cache)
        r = g + a
        o = r + layer.mlp(layer.post_attention_layernorm(r))
        return o, self.norm(o)


# ---- training ---------------------------------------------------------------------------------
@dataclass
class Eagle3TrainConfig:
    taps: list[int] | None = None        # target layers fused (default_taps of the target)
    ttt_steps: int = 3                   # training-time test unroll (not the inference draft_len)
    loss_decay: float = 0.8              # weight of step s is loss_decay^s (SafeAILab/EAGLE's 0.8)
    draft_vocab_size: int | None = 8192  # lm_head over the N most frequent training tokens (None: all)
    train_context: int | None = 96       # prompt tokens kept before each completion (None: all)


def ttt_masks(m: int, steps: int, dtype, start: torch.Tensor | None = None, first_row: int = 0) -> list[torch.Tensor]:
    """Additive masks per TTT step. Step 0: (B, 1, m, m), causal over the step-0 keys from the
    sequence's first real column `start[b]` on (left padding sees only itself). Step s >= 1, rows
    first_row..m-1 only (r of them): (B, 1, r, m + s r), the same step-0 keys plus the row's own
    key of each later step (a diagonal block)."""
    start = torch.zeros(1, dtype=torch.long) if start is None else start.cpu()
    j = torch.arange(m)
    causal, diagonal = (j[None, :] <= j[:, None])[None], (j[None, :] == j[:, None])[None]
    block0 = causal & ((j[None, None, :] >= start[:, None, None]) | diagonal)
    r = m - first_row
    eye = torch.eye(r, dtype=torch.bool)[None].expand(len(start), -1, -1)
    out = []
    for s in range(steps):
        visible = block0 if s == 0 else torch.cat([block0[:, first_row:]] + [eye] * s, dim=2)
        out.append(torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)[:, None])
    return out


class TTTBatch(NamedTuple):
    ids: torch.Tensor       # (B, n)
    feats: torch.Tensor     # (B, n, T*H) fused-input taps
    targets: torch.Tensor   # (B, n) the target's token at completion column c, -1 elsewhere
    start: torch.Tensor     # (B,) first real column
    soft: tuple[torch.Tensor, torch.Tensor] | None = None  # (B, n, K) top-K target ids (-1: none), logp


def ttt_batch(seqs, taps: list[int], context: int | None, dtype, device) -> TTTBatch:
    """Prompts clipped to their last `context` tokens and left-padded so that every completion
    starts in the same column: later TTT steps then only run the rows that lead to a label.
    targets[b, c]: the target's token at completion column c (Sequence.targets); soft: its top K
    there (Sequence.soft_targets), where the sequences carry them."""
    clipped = []
    for s in seqs:
        a = 0 if context is None else max(0, s.prompt_len - context)
        clipped.append((s.ids[a:], torch.cat([s.taps[t][a:] for t in taps], dim=-1), s.prompt_len - a, a))
    C = max(c[2] for c in clipped)
    n = C + max(len(c[0]) - c[2] for c in clipped)
    ids = torch.zeros(len(seqs), n, dtype=torch.long)
    feats = torch.zeros(len(seqs), n, clipped[0][1].shape[-1], dtype=dtype)
    targets = torch.full((len(seqs), n), -1, dtype=torch.long)
    start = torch.zeros(len(seqs), dtype=torch.long)
    for b, ((x, f, p, a), seq) in enumerate(zip(clipped, seqs)):
        o = start[b] = C - p
        ids[b, o:o + len(x)], feats[b, o:o + len(x)] = x, f.to(dtype)
        targets[b, o:o + len(x)] = seq.targets[a:]
    soft = padded_soft(seqs, n, start, [c[3] for c in clipped])
    soft = None if soft is None else (soft[0].to(device), soft[1].to(device))
    return TTTBatch(ids.to(device), feats.to(device), targets.to(device), start.to(device), soft)


def ttt_unroll(drafter: Eagle3Drafter, model, batch: TTTBatch, steps: int):
    """The TTT unroll over a ttt_batch -> per step (draft logits of labelled rows, target-id labels,
    their soft labels ((rows, K) target ids, logp) or None)."""
    ids, feats, targets, start, soft = batch
    B, n = ids.shape
    m = n - 1                                       # rows 0..n-2 (row j reads token j+1)
    embed, rotary = model.model.embed_tokens, model.model.rotary_emb
    ids_pad = F.pad(ids, (0, steps + 1))            # tokens past the end: 0, never labelled
    tgt_pad = F.pad(targets, (0, steps + 1), value=-1)
    if soft is not None:
        soft = (F.pad(soft[0], (0, 0, 0, steps + 1), value=-1),
                F.pad(soft[1], (0, 0, 0, steps + 1), value=float("-inf")))
    # after step 0 only rows with a label at some later step matter: j + s + 2 >= first label
    labelled = (targets >= 0).any(0).nonzero()
    first = int(labelled[0]) if len(labelled) else n
    a = max(0, min(m - 1, first - steps - 1))
    masks = ttt_masks(m, steps, feats.dtype, start, a)
    cache = DynamicCache(config=drafter.layer_config)  # keys of every step; autograd through them
    g = drafter.fc(feats[:, :m])
    out = []
    for s in range(steps):
        rows = torch.arange(0 if s == 0 else a, m, device=ids.device)
        if s == 1:
            g = g[:, a:]
        pos = (rows[None] - start[:, None]).clamp(min=0) + s  # row j drafts position j+s
        emb = embed(ids_pad[:, rows + s + 1])
        g, normed = drafter(g, emb, pos, rotary(g, pos), masks[s].to(ids.device), cache)
        y = tgt_pad[:, rows + s + 2]                # the label of row j at step s is x_(j+s+2)
        ok = y >= 0
        ys = None if soft is None else (soft[0][:, rows + s + 2][ok], soft[1][:, rows + s + 2][ok])
        out.append((drafter.lm_head(normed[ok]), y[ok], ys))
    return out


def ttt_loss(outs, t2d: torch.Tensor, decay: float) -> tuple[torch.Tensor, list[float]]:
    """Weighted CE (labels outside the draft vocabulary left out) and top-1 accuracy per step
    (a label outside the draft vocabulary is a miss)."""
    total, accs = None, []
    for s, (logits, labels, soft) in enumerate(outs):
        d = t2d[labels]
        valid = d >= 0
        if not valid.any():
            ce = logits.sum() * 0
        elif soft is None:
            ce = F.cross_entropy(logits[valid].float(), d[valid])
        else:   # the target's top K as draft indices; rows whose hard label is outside are left out, as above
            ce = soft_cross_entropy(logits[valid], to_drafter(soft[0][valid], t2d), soft[1][valid])
        total = decay ** s * ce if total is None else total + decay ** s * ce
        accs.append((logits.argmax(-1) == d).float().mean().item() if len(d) else float("nan"))
    return total, accs


def expected_chain_acceptance(acc: list[float]) -> list[float]:
    """Acceptance proxy: expected accepted tokens of a chain of length k, sum over d <= k of
    acc_1 ... acc_d (step accuracies are conditional on the earlier steps being right)."""
    out, run, total = [], 1.0, 0.0
    for a in acc:
        run *= a
        total += run
        out.append(total)
    return out


TRAIN_SETTINGS = {"eagle3": Eagle3TrainConfig}


def hidden_taps(config, settings: dict) -> list[int]:
    return list(settings.get("eagle3", {}).get("taps") or default_taps(config.num_hidden_layers))


def setup(target, data, settings: dict, tcfg, device: str):
    """Examples are sequences, unrolled for ttt_steps; the layer starts from the target's last."""
    from ..train.driver import Trainee
    ecfg = Eagle3TrainConfig(**settings.get("eagle3", {}))
    ecfg.taps = hidden_taps(target.config, settings)
    if ecfg.ttt_steps < 1:
        raise ValueError(f"eagle3.ttt_steps must be >= 1, not {ecfg.ttt_steps}")
    dtype = getattr(torch, tcfg.dtype)
    model = frozen_target(target, tcfg.dtype, device)   # the frozen embedding and rotary embedding
    V = model.config.vocab_size
    full = ecfg.draft_vocab_size in (None, V)
    vocab = torch.arange(V) if full else frequent_tokens(data.train, ecfg.draft_vocab_size, V)
    t2d = torch.full((V,), -1, dtype=torch.long)
    t2d[vocab] = torch.arange(len(vocab))
    t2d = t2d.to(device)
    drafter = Eagle3Drafter.for_target(model, ecfg.taps, vocab)
    drafter.init_from_target(model)
    drafter.to(device, dtype)

    def batch_of(seqs):
        return ttt_batch(seqs, ecfg.taps, ecfg.train_context, dtype, device)

    def loss(module, idx, step):
        outs = ttt_unroll(module, model, batch_of([data.train[i] for i in idx]), ecfg.ttt_steps)
        value, accs = ttt_loss(outs, t2d, ecfg.loss_decay)
        return value, {f"acc_step{s + 1}": acc for s, acc in enumerate(accs)}

    def evaluate(module):   # top-1 accuracy per unrolled step, and the chain it implies
        proxy = {}
        for name, seqs in data.eval_splits().items():
            hits, count = torch.zeros(ecfg.ttt_steps), torch.zeros(ecfg.ttt_steps)
            for a in range(0, len(seqs), tcfg.batch_size):
                outs = ttt_unroll(module, model, batch_of(seqs[a:a + tcfg.batch_size]), ecfg.ttt_steps)
                for s, (logits, labels, _) in enumerate(outs):
                    hits[s] += (vocab.to(device)[logits.argmax(-1)] == labels).sum().item()
                    count[s] += len(labels)
            acc = (hits / count.clamp(min=1)).tolist()
            proxy[name] = {"accuracy_per_step": acc, "expected_accepted_chain": expected_chain_acceptance(acc)}
        return proxy

    vocab_info = {"size": len(vocab), "train_label_coverage": coverage(data.train, vocab, V),
                  "heldout_label_coverage": coverage(data.heldout, vocab, V)}

    def save(out_dir, train_config, log, eval_proxy):
        state = {k: v if k == "draft_vocab" else v.float() for k, v in drafter.state_dict().items()}
        save_trained(out_dir, NAME, asdict(ecfg), state, model.config, train_config, log, eval_proxy,
                     extra={"draft_vocab": vocab_info})

    return Trainee(drafter, len(data.train), loss, evaluate, save, asdict(ecfg),
                   f"taps {ecfg.taps}, ttt_steps {ecfg.ttt_steps}, draft vocabulary {vocab_info}")


def load_module(ckpt_dir: str, model) -> Eagle3Drafter:
    meta, state = load_proposer(ckpt_dir, NAME, model.config)
    drafter = Eagle3Drafter.for_target(model, meta["config"]["taps"], state["draft_vocab"])
    drafter.load_state_dict(state)
    return drafter


# ---- inference --------------------------------------------------------------------------------
@dataclass
class Eagle3Config:
    checkpoint: str
    draft_len: int = 2                 # chain length / tree depth
    tree_topk: int = 1                 # 1: chain mode; k: EAGLE-2 tree, k children per expanded node
    max_tree_nodes: int | None = None  # tree: the N draft nodes of highest cumulative draft log-prob


class Eagle3Proposer:
    drafts_from_prompt = False  # drafts from the target's hidden states: needs the prefill first

    def __init__(self, cfg: Eagle3Config, target):
        if cfg.draft_len < 1 or cfg.tree_topk < 1:
            raise ValueError(f"eagle3: draft_len and tree_topk must be >= 1 (got {cfg.draft_len}, {cfg.tree_topk})")
        self.cfg = cfg
        self.nodes = cfg.max_tree_nodes or (cfg.draft_len if cfg.tree_topk == 1 else cfg.tree_topk * cfg.draft_len)
        model = target.model
        self.drafter = load_module(cfg.checkpoint, model).to(target.device, target.dtype).eval()
        self.tap_layers = tuple(self.drafter.taps)
        self.embed, self.rotary = model.model.embed_tokens, model.model.rotary_emb
        self.vocab_size = model.get_output_embeddings().weight.shape[0]   # the target's (q's) vocabulary
        self.dtype, self.device = target.dtype, target.device
        V = len(self.drafter.draft_vocab)
        self.draft_shape = (f"chain {cfg.draft_len}" if cfg.tree_topk == 1 else
                            f"dynamic tree {self.nodes} nodes, depth {cfg.draft_len}, top-{cfg.tree_topk}") + \
                           f", draft vocab {V}, taps {list(self.tap_layers)}"

    def _fuse(self, hidden) -> torch.Tensor:
        return self.drafter.fc(torch.cat([hidden[t] for t in self.tap_layers], dim=-1))

    def start(self, prompt_ids, hidden, sampler=None) -> None:
        # T > 0: chain mode draws each token from the processed draft distribution (Draft.q);
        # tree mode keeps its top-k candidates (point masses for the verifier)
        self.sampler = sampler if self.cfg.tree_topk == 1 else None
        self.cache = new_cache(self.drafter.layer_config)
        self.committed = 0              # exact rows in the cache (positions 0..committed-1)
        self.queue = self._fuse(hidden)  # fused features of verified positions not yet run

    def observe(self, step: StepResult) -> None:
        self.queue = torch.cat([self.queue, self._fuse(step.hidden)])  # [old pending, *accepted]

    def _run(self, g, tokens: list[int], pos, mask, last_only: bool = False):
        emb = self.embed(torch.tensor([tokens], device=self.device))
        o, normed = self.drafter(g[None], emb, pos, self.rotary(emb, pos), mask, self.cache)
        normed = normed[0, -1:] if last_only else normed[0]   # the LM head only where it is read
        logp = torch.log_softmax(self.drafter.lm_head(normed).float(), dim=-1)
        return o[0], logp

    def propose(self, ids: list[int], max_depth: int | None = None) -> Draft:
        n, c, k = len(ids), self.committed, self.cfg.tree_topk
        # rows c..n-2: the target's features and verified tokens ids[c+1..n-1]; exact, kept
        mask, pos = tree_attention_inputs(list(range(-1, len(self.queue) - 1)), c, self.dtype, self.device)
        o, logp = self._run(self.queue, ids[c + 1:n], pos, mask, last_only=True)
        self.committed, self.queue = n - 1, self.queue[:0]
        c = n - 1
        # candidates: token, cumulative log-prob, parent candidate (-1: the pending token), depth
        qs = []
        values, indices = self._candidates(logp[-1:], qs)
        tok = self.drafter.draft_vocab[indices[0]].tolist()
        score, parent, depth = values[0].tolist(), [-1] * k, [1] * k
        state = o[-1:].expand(k, -1)   # the state each candidate's expansion row reads
        frontier = list(range(k))
        rows_parent, cand_row = [], [-1] * k  # expansion rows (a forest over the cache); row that made each
        for d in range(1, draft_limit(self.cfg.draft_len, max_depth)):
            # expand the frontier: one row per node, at position n-2+d, attending to the cache
            # and to the rows of its ancestors
            new_parents = [cand_row[f] for f in frontier]
            e = len(rows_parent)
            rows_parent += new_parents
            visible = torch.ones(len(frontier), c + len(rows_parent), dtype=torch.bool)
            visible[:, c:] = ancestor_matrix(rows_parent)[e:]
            mask = torch.zeros(visible.shape, dtype=self.dtype).masked_fill_(~visible, torch.finfo(self.dtype).min)
            pos = torch.full((1, len(frontier)), n - 2 + d, device=self.device)
            o, logp = self._run(state, [tok[f] for f in frontier], pos, mask[None, None].to(self.device))
            values, indices = self._candidates(logp, qs)                # (frontier, k)
            parent_score = torch.tensor([score[f] for f in frontier], device=logp.device)
            child_score = (parent_score[:, None] + values).flatten()
            child_tok = self.drafter.draft_vocab[indices.flatten()].tolist()
            first = len(tok)
            for i, f in enumerate(frontier):
                for j in range(k):
                    tok.append(child_tok[i * k + j])
                    parent.append(f)
                    depth.append(d + 1)
                    cand_row.append(e + i)
            score += child_score.tolist()
            # EAGLE-2: expand next the k children of highest cumulative log-prob
            best = child_score.topk(k).indices.tolist()
            frontier = [first + b for b in best]
            state = o[[b // k for b in best]]
        if rows_parent:
            self.cache.crop(-len(rows_parent))  # drop every draft-dependent row
        # the draft tree: the N candidates of highest score (a child never scores above its
        # parent, so the set holds every chosen node's ancestors), parents before children
        chosen = sorted(range(len(tok)), key=lambda i: (-score[i], depth[i]))[: self.nodes]
        chosen.sort(key=lambda i: (depth[i], i))
        index = {cand: i for i, cand in enumerate(chosen)}
        q = None
        if qs:   # chain mode at T > 0: candidate i is draft token i, drawn from qs[i]
            q = torch.zeros(len(chosen), self.vocab_size, device=self.device)
            q[:, self.drafter.draft_vocab.to(self.device)] = torch.cat(qs)[chosen]
        return Draft([tok[i] for i in chosen], [-1 if parent[i] < 0 else index[parent[i]] for i in chosen], q)

    def _candidates(self, logp: torch.Tensor, qs: list) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, draft vocab) log-probs -> the k candidates per row: (log-probs, draft-vocab
        indices), each (rows, k). Greedy or tree: the k best. Chain at T > 0: one token drawn
        from the processed draft distribution, which is appended to `qs`."""
        if self.sampler is None:
            top = logp.topk(self.cfg.tree_topk, dim=-1)
            return top.values, top.indices
        indices, probs = self.sampler.sample(logp)           # (rows,), (rows, draft vocab)
        qs.append(probs)
        return logp.gather(-1, indices[:, None]), indices[:, None]


PARAMS = Eagle3Config
EXAMPLE = {"params": {"draft_len": 3, "tree_topk": 2, "max_tree_nodes": 5},
           "vllm_params": {"draft_len": 2},   # vLLM serves the chain
           "train": {"train": {"steps": 6, "batch_size": 4, "save_every": 3},
                     "eagle3": {"taps": [1, 2, 3], "ttt_steps": 2, "draft_vocab_size": 48}}}


def build(params: dict, target) -> Eagle3Proposer:
    return Eagle3Proposer(Eagle3Config(**params), target)


def tuning_grid(p: Eagle3Config) -> dict:
    # a tree: its node budget at the variant's depth; a chain: its length (one drafter step per token)
    if p.tree_topk > 1:
        return {"max_tree_nodes": [6, 10, 16, 24]}
    return {"draft_len": [1, 2, 3, 4]}


# ---- vLLM ---------------------------------------------------------------------------------------
VLLM = VllmServing(export="draft")


def vllm_config(p: Eagle3Config, export_dir: str) -> dict:
    if p.tree_topk != 1:
        raise ValueError("eagle3: the vLLM rows run chain mode (tree_topk 1); vLLM's tree drafting is not used")
    return {"method": "eagle3", "model": str(export_dir), "num_speculative_tokens": p.draft_len}


def export_vllm(ckpt_dir: str, target_dir: str, out_dir: str) -> None:
    """Write vLLM's LlamaForCausalLMEagle3 draft directory (vllm/model_executor/models/
    llama_eagle3.py): weights `fc`, `midlayer.*`, `norm`, `lm_head` as trained, `d2t` offsets
    (draft index i -> target id i + d2t[i]) only for a reduced draft vocabulary (vLLM refuses
    d2t otherwise), no embedding (vLLM shares the target's). Config: a one-layer Llama with
    `draft_vocab_size`, `target_hidden_size` and `eagle_aux_hidden_state_layer_ids`."""
    from transformers import AutoConfig, LlamaConfig

    tcfg = AutoConfig.from_pretrained(target_dir)
    meta, state = load_proposer(ckpt_dir, NAME, tcfg)
    dtype = getattr(tcfg, "dtype", None) or torch.float32
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    vocab = state.pop("draft_vocab")
    weights = {name: value.to(dtype) for name, value in state.items()}
    V = tcfg.vocab_size
    if len(vocab) < V:
        weights["d2t"] = vocab - torch.arange(len(vocab))
    head_dim = getattr(tcfg, "head_dim", None) or tcfg.hidden_size // tcfg.num_attention_heads
    llama = LlamaConfig(
        vocab_size=V, hidden_size=tcfg.hidden_size, intermediate_size=tcfg.intermediate_size,
        num_hidden_layers=1, num_attention_heads=tcfg.num_attention_heads,
        num_key_value_heads=tcfg.num_key_value_heads, head_dim=head_dim, hidden_act=tcfg.hidden_act,
        max_position_embeddings=tcfg.max_position_embeddings, rms_norm_eps=tcfg.rms_norm_eps,
        rope_parameters=dict(tcfg.rope_parameters), tie_word_embeddings=False,
        attention_bias="midlayer.self_attn.q_proj.bias" in weights,
        bos_token_id=tcfg.bos_token_id, eos_token_id=tcfg.eos_token_id)
    config = llama.to_dict()
    taps = meta["config"]["taps"]
    config.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=len(vocab),
                  target_hidden_size=tcfg.hidden_size, eagle_aux_hidden_state_layer_ids=taps,
                  eagle_config={"eagle_aux_hidden_state_layer_ids": taps, "use_aux_hidden_state": True},
                  dtype=str(dtype).removeprefix("torch."))
    write_model_dir(out_dir, weights, config,
                    {"method": NAME, "export": "vllm LlamaForCausalLMEagle3", "checkpoint": str(ckpt_dir),
                     "target": str(target_dir), "taps": taps})
