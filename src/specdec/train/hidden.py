"""The frozen target's labels and hidden states over the distillation set: one forward pass,
computed once as a DAG artifact.

Every learned method trains on the labels; Medusa, MTP and EAGLE-3 also on the hidden states.
Recomputing the target forward per method per epoch would cost far more than reading this file.
The labels are the target's own argmax at every completion position (self-distillation): on a
record whose completion is the target's greedy output they are that output's next tokens; on a
reference reply (a fixed text) they are what the target would have said at each of its positions.
Layout (one safetensors file; the reader maps it, so a split's states are read as batches use them):
  {split}.ids          int64 (tokens,)        prompt_ids + completion_ids of every record, concatenated
  {split}.offsets      int64 (records + 1,)   record r is ids[offsets[r]:offsets[r + 1]]
  {split}.prompt_len   int64 (records,)
  {split}.labels       int64 (tokens,)        label t: the target's argmax after ids[:t + 1], at the
                                              positions whose next token is a completion token; -1 elsewhere
  {split}.soft_ids     int32 (tokens, K)      the target's K most likely tokens after ids[:t + 1], where
  {split}.soft_logp    float32 (tokens, K)    there is a label (-1 / -inf elsewhere), and their log-probabilities
                                              under its full softmax: the soft labels (soft_topk K; 0: none)
  {split}.tap{L}       (tokens, hidden)       tap L (core.target.tap_module: the residual stream after
                                              L decoder layers, before the final norm), in `store_dtype`
metadata: target, hidden_size, vocab_size, num_layers, taps, tap_space, soft_topk, dtype (compute), store_dtype.
The taps are captured by the same forward hooks as the decoding loop's (core.target.tap_hooks), so a
proposer is trained on the tensors it is served.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from ..core.target import tap_hooks
from ..data.records import atomic_path, read_jsonl
from ..models import load_causal_lm

IGNORE = -1   # a position without a label
# what a tap means (core.target): files that lack it, or say otherwise, are refused
TAP_SPACE = "residual stream, before the final norm (core.target.tap_module)"


@torch.inference_mode()
def compute_hidden_states(model, records: list[dict], taps: list[int], batch_size: int = 8, desc: str = "hidden states",
                          store_dtype: torch.dtype | None = None, soft_topk: int = 0) -> dict[str, torch.Tensor]:
    """Run the target over prompt + completion of each record; keep the taps of every token and
    the target's argmax (and its top `soft_topk` log-probabilities) at every position whose next
    token is a completion token."""
    seqs = [list(r["prompt_ids"]) + list(r["completion_ids"]) for r in records]
    plens = [len(r["prompt_ids"]) for r in records]
    offsets = [0] + torch.tensor([len(s) for s in seqs], dtype=torch.long).cumsum(0).tolist()
    total, hidden = offsets[-1], model.config.hidden_size
    dtype = store_dtype or next(model.parameters()).dtype
    # every output preallocated and written in place: no per-record tensors to concatenate (which
    # would double the peak) and no heap fragmented by them
    tensors = {
        "ids": torch.tensor([t for s in seqs for t in s], dtype=torch.long),
        "offsets": torch.tensor(offsets, dtype=torch.long),
        "prompt_len": torch.tensor(plens, dtype=torch.long),
        "labels": torch.full((total,), IGNORE, dtype=torch.long),
        **{f"tap{layer}": torch.empty(total, hidden, dtype=dtype) for layer in taps},
    }
    if soft_topk:
        tensors["soft_ids"] = torch.full((total, soft_topk), IGNORE, dtype=torch.int32)
        tensors["soft_logp"] = torch.full((total, soft_topk), float("-inf"))
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))  # similar lengths share a batch
    device = next(model.parameters()).device
    hs: dict[int, torch.Tensor] = {}
    hooks = tap_hooks(model, taps, hs)   # hs[layer]: (batch, width, hidden) of the last forward
    try:
        for start in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch"):
            idx = order[start:start + batch_size]
            width = max(len(seqs[i]) for i in idx)
            # right padding: under the causal mask real tokens never see the pad tokens after them
            ids = torch.zeros(len(idx), width, dtype=torch.long)
            for row, i in enumerate(idx):
                ids[row, :len(seqs[i])] = torch.tensor(seqs[i])
            last = model.model(input_ids=ids.to(device), use_cache=False).last_hidden_state
            for row, i in enumerate(idx):
                o, n, a = offsets[i], len(seqs[i]), max(plens[i] - 1, 0)
                for layer, h in hs.items():
                    tensors[f"tap{layer}"][o:o + n] = h[row, :n]
                # label t = argmax p(. | ids[:t + 1]) for t in [prompt_len - 1, n - 2]: the LM head
                # only where there is a label ((n - a - 1, hidden) @ (hidden, V)), on the post-norm state
                logits = model.lm_head(last[row, a:n - 1]).float()          # (n - a - 1, V)
                tensors["labels"][o + a:o + n - 1] = logits.argmax(-1).cpu()
                if soft_topk:
                    top = torch.log_softmax(logits, -1).topk(soft_topk, dim=-1)  # log p(v | ids[:t + 1]), top K
                    tensors["soft_ids"][o + a:o + n - 1] = top.indices.cpu().int()
                    tensors["soft_logp"][o + a:o + n - 1] = top.values.cpu()
    finally:
        for h in hooks:
            h.remove()
    return tensors


def write_hidden_states(target_dir: str, splits: dict[str, str], taps: list[int], out: str,
                        dtype: str = "bfloat16", device: str = "cpu", batch_size: int = 8,
                        store_dtype: str | None = None, soft_topk: int = 0) -> None:
    """`dtype`: the forward's; `store_dtype`: the stored states' (None: the forward's); soft_topk:
    how many of the target's most likely next tokens are kept as soft labels (0: none)."""
    model = load_causal_lm(target_dir, dtype, device)
    store = getattr(torch, store_dtype or dtype)
    tensors = {}
    for split, path in splits.items():
        records = read_jsonl(path, ("prompt_ids", "completion_ids"))
        for name, t in compute_hidden_states(model, records, taps, batch_size, desc=split, store_dtype=store,
                                             soft_topk=soft_topk).items():
            tensors[f"{split}.{name}"] = t
    meta = {"target": str(target_dir), "hidden_size": model.config.hidden_size,
            "vocab_size": model.config.vocab_size, "num_layers": model.config.num_hidden_layers,
            "taps": taps, "tap_space": TAP_SPACE, "soft_topk": soft_topk, "dtype": dtype,
            "store_dtype": str(store).removeprefix("torch."), "splits": list(splits)}
    with atomic_path(out) as tmp:
        save_file(tensors, tmp, metadata={"specdec": json.dumps(meta)})


@dataclass
class Sequence:
    ids: torch.Tensor                 # (n,) prompt + completion
    prompt_len: int
    taps: dict[int, torch.Tensor]     # layer -> (n, hidden)
    labels: torch.Tensor | None = None  # (n,) label t: the target's token after ids[:t + 1]; IGNORE (-1)
                                        # where none. None: the completion's own next tokens
                                        # (the completion is the target's greedy output)
    soft: tuple[torch.Tensor, torch.Tensor] | None = None  # (ids (n, K), logp (n, K)) aligned with
                                        # labels: the target's top K after ids[:t + 1]; None: hard labels only

    def __post_init__(self):
        if self.labels is None:
            self.labels = torch.full((len(self.ids),), IGNORE, dtype=torch.long)
            a = max(self.prompt_len - 1, 0)
            self.labels[a:len(self.ids) - 1] = self.ids[a + 1:]

    @property
    def targets(self) -> torch.Tensor:
        """(n,) the target's token at each completion position (the label of the position before),
        IGNORE elsewhere: what a drafter reading position t's input predicts for position t."""
        return torch.cat([self.labels.new_full((1,), IGNORE), self.labels[:-1]])

    @property
    def soft_targets(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(ids (n, K), logp (n, K)) aligned with `targets` (the soft labels shifted by one)."""
        if self.soft is None:
            return None
        ids, logp = self.soft
        return (torch.cat([ids.new_full((1, ids.shape[1]), IGNORE), ids[:-1]]),
                torch.cat([logp.new_full((1, logp.shape[1]), float("-inf")), logp[:-1]]))

    def clip(self, start: int) -> Sequence:
        """The sequence from token `start` on (its prompt shortened; the labels kept)."""
        return Sequence(self.ids[start:], self.prompt_len - start, {t: v[start:] for t, v in self.taps.items()},
                        self.labels[start:],
                        None if self.soft is None else (self.soft[0][start:], self.soft[1][start:]))


class HiddenStates:
    """Reader of the artifact: `meta`, and `split(name, taps)` -> list[Sequence]."""

    def __init__(self, path: str):
        self.path = path
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: hidden-state file not found")
        with safe_open(path, "pt") as f:
            self.meta = json.loads((f.metadata() or {}).get("specdec", "null") or "null")
        if not self.meta:
            raise ValueError(f"{path}: not a specdec hidden-state file (no 'specdec' metadata)")
        if self.meta.get("tap_space") != TAP_SPACE:
            space = self.meta.get("tap_space") or "output_hidden_states (the last one after the final norm)"
            raise ValueError(f"{path}: its taps are {space}, not the decoding loop's ({TAP_SPACE}): "
                             f"delete it and rerun the hidden_states job")

    def check_target(self, config) -> None:
        for field in ("hidden_size", "vocab_size"):
            if self.meta[field] != getattr(config, field):
                raise ValueError(f"{self.path}: {field} {self.meta[field]} does not match the "
                                 f"target's {field} {getattr(config, field)}")

    def split(self, name: str, taps: list[int], records: int | None = None, soft: bool = False) -> list[Sequence]:
        """The split's sequences (the first `records` of them), their taps views of the mapped file;
        soft: with their soft labels (an error where the file has none)."""
        if soft and not self.meta.get("soft_topk"):
            raise ValueError(f"{self.path}: no soft labels (its soft_topk is {self.meta.get('soft_topk', 0)}): "
                             f"set train.hidden.soft_topk in the config, or train without train.soft_labels")
        if name not in self.meta["splits"]:
            raise ValueError(f"{self.path}: no split {name!r} (has {self.meta['splits']})")
        missing = [t for t in taps if t not in self.meta["taps"]]
        if missing:
            raise ValueError(f"{self.path}: taps {missing} were not computed (has {self.meta['taps']}); "
                             f"add them to train.hidden.taps in the config")
        with safe_open(self.path, "pt") as f:
            ids, off = f.get_tensor(f"{name}.ids"), f.get_tensor(f"{name}.offsets").tolist()
            plen = f.get_tensor(f"{name}.prompt_len").tolist()
            if f"{name}.labels" not in f.keys():
                raise ValueError(f"{self.path}: split {name!r} has no labels (a file from an older "
                                 f"version of specdec: delete it and rerun the hidden_states job)")
            labels = f.get_tensor(f"{name}.labels")
            soft = (f.get_tensor(f"{name}.soft_ids"), f.get_tensor(f"{name}.soft_logp")) if soft else None
            # get_tensor maps the file (no copy): a tap is read from disk when a batch slices it
            tap = {t: f.get_tensor(f"{name}.tap{t}") for t in taps}
        if records is not None and not 1 <= records <= len(plen):
            raise ValueError(f"{self.path}: split {name!r} has {len(plen)} records, {records} requested")
        bounds = list(zip(off[:-1], off[1:]))[:records]
        return [Sequence(ids[a:b], plen[r], {t: v[a:b] for t, v in tap.items()}, labels[a:b],
                         None if soft is None else (soft[0][a:b], soft[1][a:b]))
                for r, (a, b) in enumerate(bounds)]
