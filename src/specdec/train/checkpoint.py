"""The checkpoint format of every learned proposer: `model.safetensors` (the proposer's own
weights), `config.json` ({"method", "config", "target": {name, hidden_size, vocab_size}, ...})
and `manifest.json`, written last, which marks the checkpoint complete (the DAG's target file).
Loading refuses a checkpoint made for another method or a target of another shape."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..data.records import atomic_path, read_json, write_json


class CheckpointMismatch(ValueError):
    pass


def target_signature(config) -> dict:
    return {"hidden_size": config.hidden_size, "vocab_size": config.vocab_size,
            "num_layers": config.num_hidden_layers, "model_type": config.model_type}


def checkpoint_record(ckpt_dir: str) -> tuple[str, dict]:
    """A trained checkpoint's record (training settings, log, eval proxy): specdec.json beside a
    Hugging Face draft LM's own config.json, else the proposer's config.json. -> (path, contents)"""
    d = Path(ckpt_dir)
    p = d / "specdec.json" if (d / "specdec.json").is_file() else d / "config.json"
    return str(p), read_json(p)


def save_proposer(out_dir: str, method: str, settings: dict, state: dict[str, torch.Tensor],
                  target_config, extra: dict | None = None) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, out / "model.safetensors")
    cfg = {"method": method, "config": settings, "target": target_signature(target_config), **(extra or {})}
    write_json(out / "config.json", cfg)
    write_json(out / "manifest.json", {"method": method, "files": ["model.safetensors", "config.json"]})


def save_trained(out_dir: str, method: str, settings: dict, state: dict[str, torch.Tensor], target_config,
                 train_config: dict, log: list[dict], eval_proxy: dict, extra: dict | None = None) -> None:
    """save_proposer plus what every trained checkpoint records (training settings, time, log and
    eval proxy). The training driver drops the resume state after the save."""
    save_proposer(out_dir, method, settings, state, target_config,
                  extra={**(extra or {}), "train": train_config, "train_seconds": log[-1]["elapsed_s"],
                         "eval_proxy": eval_proxy, "train_log": log})


def write_model_dir(out_dir: str, weights: dict[str, torch.Tensor], config: dict, manifest: dict,
                    copy_from: str | None = None, copy_names: tuple[str, ...] = ()) -> None:
    """A directory vLLM loads (model.safetensors, config.json, the named files copied from
    `copy_from` where present) plus manifest.json, written atomically: an interrupted export
    never leaves a half-written directory."""
    import shutil

    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        save_file({k: v.contiguous() for k, v in weights.items()}, tmp / "model.safetensors", metadata={"format": "pt"})
        write_json(tmp / "config.json", config)
        for name in copy_names:
            if (Path(copy_from) / name).exists():
                shutil.copy2(Path(copy_from) / name, tmp / name)
        write_json(tmp / "manifest.json", manifest)


def read_meta(ckpt_dir: str, method: str, meta_name: str, required: tuple[str, ...]) -> dict:
    """A checkpoint's metadata (`meta_name`), after checking that `required` files are there and
    that it was made for `method`."""
    d = Path(ckpt_dir)
    for name in required:
        if not (d / name).is_file():
            raise FileNotFoundError(f"{d}: {method} checkpoint is missing {name}")
    meta = json.loads((d / meta_name).read_text())
    if meta.get("method") != method:
        raise CheckpointMismatch(f"{d}/{meta_name}: checkpoint is for method {meta.get('method')!r}, not {method!r}")
    return meta


def load_proposer(ckpt_dir: str, method: str, target_config) -> tuple[dict, dict[str, torch.Tensor]]:
    """-> (config.json contents, state dict), after checking it was made for this method and a
    target of this shape; a mismatch names the field and both values."""
    d = Path(ckpt_dir)
    cfg = read_meta(ckpt_dir, method, "config.json", ("manifest.json", "config.json", "model.safetensors"))
    want = target_signature(target_config)
    for field in ("hidden_size", "vocab_size"):
        have = cfg.get("target", {}).get(field)
        if have != want[field]:
            raise CheckpointMismatch(f"{d}/config.json: target.{field} is {have} but the target model's "
                                     f"{field} is {want[field]}")
    return cfg, load_file(d / "model.safetensors")
