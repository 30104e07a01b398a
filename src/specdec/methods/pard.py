"""PARD (parallel draft model): a draft LM that predicts k future tokens in ONE forward.

Inference: after the verified context x_0..x_t (x_t the pending token) the draft gets k-1 mask
tokens (`pard_token`) at positions t+1..t+k-1; its outputs at t, t+1, ..., t+k-1 are draft
tokens 1..k (mask j predicts x_(t+j+1)). The masks' KV is dropped after the forward, so the draft
cache only ever holds verified tokens; the next step feeds the tokens accepted since.

Training (PARD objective, train_draft_len K): one packed sequence per example. Segment 0 is the
sequence itself (ordinary next-token prediction). Segment j = 1..K-1 holds, for anchors t, a
mask node at position t+j that attends to x_0..x_t, to the masks of the same anchor in segments
1..j and to itself, labelled x_(t+j+1): exactly what the mask sees at inference. Conditional drop
(COD): anchor t keeps its segment-j node when u_t < max(cod_ratio^j, cod_min_ratio) with one
u_t ~ U(0,1) per anchor, so kept anchors are nested across segments (a node never misses a mask
it would see at inference) and the segment sizes fall as cod_ratio^j down to cod_min_ratio.
Labels are completion tokens only (distillation on the target's greedy completions).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ..core.loop import Draft, StepResult, draft_limit
from ..train.soft import padded_soft
from . import VllmServing
from .draft_lm import IGNORE, DraftBatch, DraftLMConfig, draft_trainee, export_hf_draft, load_draft_lm, open_draft

NAME = "pard"


@dataclass
class PardTrainConfig:
    pard_token: int               # the mask token id: a token chat text never uses
    train_draft_len: int = 6      # K: draft positions trained (the reference system's --draft-len 8)
    cod_ratio: float = 0.7
    cod_min_ratio: float = 0.2


def keep_ratio(j: int, cfg: PardTrainConfig) -> float:
    """Share of anchors whose segment-j mask node is kept (segment 0 keeps everything)."""
    return 1.0 if j == 0 else max(cfg.cod_ratio ** j, cfg.cod_min_ratio)


def pard_example(ids: list[int], prompt_len: int, cfg: PardTrainConfig, u: torch.Tensor | None = None,
                 target: list[int] | None = None):
    """One packed training example -> (tokens, positions, allowed (N, N) bool, labels, label_pos).
    u[t - first]: the anchor's COD draw (None keeps every node, for evaluation). target[t]: the
    target's token after ids[:t + 1] (Sequence.labels; None: ids[t + 1])."""
    n, K = len(ids), cfg.train_draft_len
    target = ids[1:] + [IGNORE] if target is None else target
    first = max(prompt_len - 1, 0)            # first anchor: the last prompt token
    tokens, positions = list(ids), list(range(n))
    labels, label_pos = [IGNORE] * n, [0] * n
    for t in range(first, n - 1):             # segment 0: x_t predicts x_(t+1)
        labels[t], label_pos[t] = target[t], 1
    anchor, segment = list(range(n)), [0] * n
    for j in range(1, K):
        for t in range(first, n - 1 - j):     # mask (t, j) predicts x_(t+j+1)
            if u is not None and u[t - first] >= keep_ratio(j, cfg):
                continue
            tokens.append(cfg.pard_token)
            positions.append(t + j)
            labels.append(target[t + j])
            label_pos.append(j + 1)
            anchor.append(t)
            segment.append(j)
    a, s = torch.tensor(anchor), torch.tensor(segment)
    real = s == 0
    # a segment-0 key is visible up to the query's anchor; a mask key only to masks of the same
    # anchor in the same or a later segment (and the mask itself)
    allowed = (real[None, :] & (a[None, :] <= a[:, None])) | \
              (~real[None, :] & (a[None, :] == a[:, None]) & (s[None, :] <= s[:, None]))
    return tokens, positions, allowed, labels, label_pos


def pard_batch(seqs, cfg: PardTrainConfig, pad_id: int, gen: torch.Generator | None) -> DraftBatch:
    examples = []
    for sq in seqs:
        first = max(sq.prompt_len - 1, 0)
        u = None if gen is None else torch.rand(max(len(sq.ids) - first, 0), generator=gen)
        examples.append(pard_example(sq.ids.tolist(), sq.prompt_len, cfg, u, sq.labels.tolist()))
    N = max(len(e[0]) for e in examples)
    B = len(examples)
    ids = torch.full((B, N), pad_id, dtype=torch.long)
    pos = torch.zeros((B, N), dtype=torch.long)
    labels = torch.full((B, N), IGNORE, dtype=torch.long)
    lpos = torch.zeros((B, N), dtype=torch.long)
    allowed = torch.eye(N, dtype=torch.bool).repeat(B, 1, 1)   # padding rows see themselves only
    soft = padded_soft(seqs, N, shifted=False)   # (B, N, K): filled per node below
    for b, (tok, p, al, lab, lp) in enumerate(examples):
        m = len(tok)
        ids[b, :m], pos[b, :m], labels[b, :m], lpos[b, :m] = (torch.tensor(tok), torch.tensor(p),
                                                               torch.tensor(lab), torch.tensor(lp))
        allowed[b, :m, :m] = al
        if soft is not None:   # a node at position q is labelled with the target's token after ids[:q + 1]
            q = torch.tensor(p)
            soft[0][b, :m], soft[1][b, :m] = seqs[b].soft[0][q], seqs[b].soft[1][q]
            soft[0][b, :m][labels[b, :m] == IGNORE] = IGNORE
    return DraftBatch(ids, pos, labels, allowed[:, None], lpos, soft)


TRAIN_SETTINGS = {"draft": DraftLMConfig, "pard": PardTrainConfig}


def hidden_taps(config, settings: dict) -> list[int]:
    return []   # the draft trains on token ids only


def setup(target, data, settings: dict, tcfg, device: str):
    pcfg = PardTrainConfig(**settings.get("pard", {}))
    if pcfg.train_draft_len < 1 or not 0 < pcfg.cod_min_ratio <= pcfg.cod_ratio <= 1:
        raise ValueError(f"pard: need train_draft_len >= 1 and 0 < cod_min_ratio <= cod_ratio <= 1, got {pcfg}")
    pad = 0  # padding is never visible to real tokens (right padding, PARD masks)

    def make_batch(seqs, step):   # COD draws seeded by (seed, step): a resumed run redraws them
        gen = None if step is None else torch.Generator().manual_seed(tcfg.seed * 1_000_003 + step)
        return pard_batch(seqs, pcfg, pad, gen)

    def prepare(draft, train_seqs):
        if not 0 <= pcfg.pard_token < draft.config.vocab_size:
            raise ValueError(f"pard.pard_token {pcfg.pard_token} is outside the vocabulary "
                             f"(0..{draft.config.vocab_size - 1})")
        used = sum(int((s.ids == pcfg.pard_token).sum()) for s in train_seqs)
        if used:
            raise ValueError(f"pard.pard_token {pcfg.pard_token} occurs {used} times in the training data: "
                             f"choose a token chat text never uses")

    # the layout vLLM's parallel drafting reads from the draft's config.json
    extra = {"pard_token": pcfg.pard_token, "spd_type": "pard"}
    return draft_trainee(NAME, target, data, settings, tcfg, device, make_batch=make_batch,
                         max_pos=pcfg.train_draft_len, method_config={"pard": asdict(pcfg)},
                         hf_config_extra=extra, prepare=prepare)


def load_module(ckpt_dir: str, target_model):
    return load_draft_lm(ckpt_dir, NAME, target_model.config)[1]


# ---- vLLM ---------------------------------------------------------------------------------------
VLLM = VllmServing(export="draft")


def vllm_config(p: PardConfig, export_dir: str) -> dict:
    # k drafts from one forward with pard_token masks
    return {"method": "draft_model", "model": str(export_dir), "num_speculative_tokens": p.draft_len,
            "parallel_drafting": True}


def export_vllm(ckpt_dir: str, target_dir: str, out_dir: str) -> None:
    """vLLM's parallel drafting loads the Hugging Face draft with `pard_token` in its config."""
    export_hf_draft(ckpt_dir, NAME, target_dir, out_dir, require=("pard_token",))


@dataclass
class PardConfig:
    checkpoint: str
    draft_len: int = 4


class PardProposer:
    tap_layers = ()
    drafts_from_prompt = True  # no target state needed: the first step verifies a draft

    def __init__(self, cfg: PardConfig, target):
        self.cfg = cfg
        self.meta, self.draft = open_draft(cfg.checkpoint, NAME, target, cfg.draft_len)
        self.pard_token = getattr(self.draft.config, "pard_token", None)
        if self.pard_token is None:
            raise ValueError(f"{cfg.checkpoint}/config.json: no pard_token")
        self.draft_shape = (f"chain k={cfg.draft_len} from one draft forward, "
                            f"draft LM of {self.draft.num_layers} layers")

    def start(self, prompt_ids, hidden, sampler=None) -> None:
        self.sampler = sampler
        self.draft.prefill([])  # an empty cache: the first propose() feeds the whole prompt

    def propose(self, ids: list[int], max_depth: int | None = None) -> Draft | None:
        d, k = self.draft, draft_limit(self.cfg.draft_len, max_depth)
        new = ids[d.cached:]                                  # accepted since last step + pending
        # drafts: the outputs at the last real token and the k-1 masks (LM head on those k only)
        logits, _ = d.forward(new + [self.pard_token] * (k - 1), logits_to_keep=k)
        d.commit(list(range(len(new))))                       # drop the masks' KV
        if self.sampler is None:
            return Draft.chain(logits.argmax(-1).tolist())
        # position i's token drawn from its own q_i (given the context, not the earlier drafts)
        tokens, q = self.sampler.sample(logits)                                # (k,), (k, V)
        return Draft.chain(tokens.tolist(), q)

    def observe(self, step: StepResult) -> None:
        pass  # the cache holds verified tokens only; propose() feeds what was accepted since


PARAMS = PardConfig
EXAMPLE = {"params": {"draft_len": 3},
           "train": {"train": {"steps": 6, "batch_size": 4, "save_every": 3},
                     "draft": {"num_layers": 1}, "pard": {"pard_token": 0, "train_draft_len": 3}}}


def build(params: dict, target) -> PardProposer:
    return PardProposer(PardConfig(**params), target)


def tuning_grid(p: PardConfig) -> dict:
    # one drafter forward whatever the length; positions past the trained ones are rarely accepted
    return {"draft_len": [2, 3, 4, 6]}
