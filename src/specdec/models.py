"""Target checkpoints: build one (from a GGUF file or a hub snapshot) and load one, with errors
that name the checkpoint."""
from __future__ import annotations

import glob
import json
import os
import shutil
from pathlib import Path

import torch

from .data.records import atomic_path
from .host import torch_dtype


class CheckpointError(RuntimeError):
    pass


def _write_manifest(out_dir: Path, source: dict) -> None:
    files = {p.name: p.stat().st_size for p in sorted(out_dir.iterdir()) if p.name != "manifest.json"}
    (out_dir / "manifest.json").write_text(json.dumps({"source": source, "files": files}, indent=2) + "\n")


def build_target_from_gguf(gguf_path: str, out_dir: str, dtype: str = "float32") -> Path:
    """De-quantise a GGUF causal LM into a plain Hugging Face checkpoint (safetensors + tokenizer).

    A gguf-loaded model refuses save_pretrained, so its weights go into a fresh model built from
    the same config without the quantization_config."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                  dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    config = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items()
                                     if k not in ("quantization_config", "transformers_version")})
    config.dtype = dtype
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(dtype))
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # tied embeddings: lm_head.weight may be absent from the state dict and shared after tying
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise CheckpointError(f"{gguf_path}: weights do not fit the config: missing {missing}, "
                              f"unexpected {unexpected}")
    model.tie_weights()
    model.generation_config = loaded.generation_config
    with atomic_path(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _write_manifest(tmp, {"gguf": gguf_path.name, "dtype": dtype})
    return Path(out_dir)


HUB_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.txt", "*.model", "*.jinja"]


def build_target_from_hub(repo_id: str, out_dir: str, revision: str | None = None) -> Path:
    """Download a hub checkpoint (full-scale config; needs network and huggingface_hub). A local
    directory in place of the repo id is copied the same way (its files that a download keeps)."""
    with atomic_path(out_dir) as tmp:
        if Path(repo_id).is_dir():
            if revision:
                raise CheckpointError(f"target.revision {revision!r}: {repo_id} is a local directory")
            files = sorted({p for pattern in HUB_FILES for p in Path(repo_id).glob(pattern) if p.is_file()})
            if not files:
                raise CheckpointError(f"{repo_id}: a local directory with no checkpoint files ({HUB_FILES})")
            Path(tmp).mkdir(parents=True)
            for src in files:
                shutil.copy2(src, Path(tmp) / src.name)
        else:
            from huggingface_hub import snapshot_download
            snapshot_download(repo_id, revision=revision, local_dir=tmp, allow_patterns=HUB_FILES)
        _write_manifest(tmp, {"hub": repo_id, "revision": revision})
    return Path(out_dir)


def check_checkpoint(path: str | os.PathLike) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: checkpoint directory not found")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: not a checkpoint (no config.json)")
    if not glob.glob(str(path / "*.safetensors")) and not glob.glob(str(path / "*.bin")):
        raise CheckpointError(f"{path}: checkpoint has no weight files (*.safetensors)")
    return path


def load_causal_lm(path: str | os.PathLike, dtype: str = "float32", device: str = "cpu",
                   attn_implementation: str = "sdpa"):
    """Load a causal LM for inference; any failure names the checkpoint path."""
    from transformers import AutoModelForCausalLM

    path = check_checkpoint(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype, device),
                                                     attn_implementation=attn_implementation)
    except Exception as e:  # corrupt safetensors, bad config, ...
        raise CheckpointError(f"{path}: cannot load checkpoint: {type(e).__name__}: {e}") from e
    return model.to(device).eval()


def load_tokenizer(path: str | os.PathLike):
    from transformers import AutoTokenizer

    path = check_checkpoint(path)
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot load tokenizer: {type(e).__name__}: {e}") from e


def eos_token_ids(model, tokenizer) -> set[int]:
    ids = set()
    gen = getattr(model, "generation_config", None)
    for src in (getattr(gen, "eos_token_id", None), tokenizer.eos_token_id):
        if src is None:
            continue
        ids.update(src if isinstance(src, (list, tuple)) else [src])
    return ids
