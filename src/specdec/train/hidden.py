"""The frozen target's hidden states over the distillation set, computed once as a DAG artifact.

Medusa, MTP and EAGLE-3 all train on them; recomputing the target forward per method per epoch
would cost far more than reading this file. Layout (one safetensors file):
  {split}.ids          int64 (tokens,)        prompt_ids + completion_ids of every record, concatenated
  {split}.offsets      int64 (records + 1,)   record r is ids[offsets[r]:offsets[r + 1]]
  {split}.prompt_len   int64 (records,)       labels are the completion tokens (distillation)
  {split}.tap{L}       (tokens, hidden)       transformers' output_hidden_states[L]
metadata: target, hidden_size, vocab_size, num_layers, taps, dtype.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from ..data.records import atomic_path, read_jsonl


@torch.inference_mode()
def compute_hidden_states(model, records: list[dict], taps: list[int], batch_size: int = 8,
                          desc: str = "hidden states") -> dict[str, torch.Tensor]:
    """Run the target over prompt + completion of each record; keep the taps of every token."""
    seqs = [list(r["prompt_ids"]) + list(r["completion_ids"]) for r in records]
    n_layers = model.config.num_hidden_layers
    for layer in taps:
        if not 0 <= layer <= n_layers:
            raise ValueError(f"hidden tap {layer} out of range 0..{n_layers}")
    out = {layer: [None] * len(seqs) for layer in taps}
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))  # similar lengths share a batch
    device = next(model.parameters()).device
    for start in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch"):
        idx = order[start:start + batch_size]
        width = max(len(seqs[i]) for i in idx)
        # right padding: under the causal mask real tokens never see the pad tokens after them
        ids = torch.zeros(len(idx), width, dtype=torch.long)
        for row, i in enumerate(idx):
            ids[row, :len(seqs[i])] = torch.tensor(seqs[i])
        hs = model.model(input_ids=ids.to(device), output_hidden_states=True, use_cache=False).hidden_states
        for layer in taps:
            for row, i in enumerate(idx):
                out[layer][i] = hs[layer][row, :len(seqs[i])].cpu()
    tensors = {
        "ids": torch.tensor([t for s in seqs for t in s], dtype=torch.long),
        "offsets": torch.tensor([0] + list(torch.tensor([len(s) for s in seqs]).cumsum(0).tolist()), dtype=torch.long),
        "prompt_len": torch.tensor([len(r["prompt_ids"]) for r in records], dtype=torch.long),
    }
    for layer in taps:
        tensors[f"tap{layer}"] = torch.cat(out[layer]).contiguous()
    return tensors


def write_hidden_states(target_dir: str, splits: dict[str, str], taps: list[int], out: str,
                        dtype: str = "bfloat16", device: str = "cpu", batch_size: int = 8) -> None:
    from ..models import load_causal_lm
    model = load_causal_lm(target_dir, dtype, device)
    tensors = {}
    for split, path in splits.items():
        records = read_jsonl(path, ("prompt_ids", "completion_ids"))
        for name, t in compute_hidden_states(model, records, taps, batch_size, desc=split).items():
            tensors[f"{split}.{name}"] = t
    meta = {"target": str(target_dir), "hidden_size": model.config.hidden_size,
            "vocab_size": model.config.vocab_size, "num_layers": model.config.num_hidden_layers,
            "taps": taps, "dtype": dtype, "splits": list(splits)}
    with atomic_path(out) as tmp:
        save_file(tensors, tmp, metadata={"specdec": json.dumps(meta)})


@dataclass
class Sequence:
    ids: torch.Tensor                 # (n,) prompt + completion
    prompt_len: int
    taps: dict[int, torch.Tensor]     # layer -> (n, hidden)


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

    def check_target(self, config) -> None:
        for field in ("hidden_size", "vocab_size"):
            if self.meta[field] != getattr(config, field):
                raise ValueError(f"{self.path}: {field} {self.meta[field]} does not match the "
                                 f"target's {field} {getattr(config, field)}")

    def split(self, name: str, taps: list[int]) -> list[Sequence]:
        if name not in self.meta["splits"]:
            raise ValueError(f"{self.path}: no split {name!r} (has {self.meta['splits']})")
        missing = [t for t in taps if t not in self.meta["taps"]]
        if missing:
            raise ValueError(f"{self.path}: taps {missing} were not computed (has {self.meta['taps']}); "
                             f"add them to train.hidden.taps in the config")
        with safe_open(self.path, "pt") as f:
            ids, off = f.get_tensor(f"{name}.ids"), f.get_tensor(f"{name}.offsets").tolist()
            plen = f.get_tensor(f"{name}.prompt_len").tolist()
            tap = {t: f.get_tensor(f"{name}.tap{t}") for t in taps}
        return [Sequence(ids[a:b], plen[r], {t: v[a:b] for t, v in tap.items()})
                for r, (a, b) in enumerate(zip(off[:-1], off[1:]))]
