"""Method registry: name -> module. Each module owns everything about its method and exposes
`build(params: dict, target) -> Proposer`; a learned method also `train_checkpoint(...)`. The core never imports from here."""
from __future__ import annotations

import importlib
from pathlib import Path

METHODS = {
    "ngram": "specdec.methods.ngram",
    "suffix": "specdec.methods.suffix",
    "medusa": "specdec.methods.medusa",
    "mtp": "specdec.methods.mtp",
    "draft_model": "specdec.methods.draft_model",
    "pard": "specdec.methods.pard",
    "eagle3": "specdec.methods.eagle3",
}


def method_module(name: str, needs: str):
    """The method's module, which must define `needs` (build, train_checkpoint, export_vllm)."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(sorted(METHODS))}")
    module = importlib.import_module(METHODS[name])
    if not hasattr(module, needs):
        raise ValueError(f"method {name!r} has no {needs}")
    return module


def build_proposer(name: str, params: dict, target=None):
    module = method_module(name, "build")
    try:
        return module.build(dict(params), target)
    except TypeError as e:  # unknown/missing keyword in the method's config dataclass
        raise ValueError(f"method {name!r}: bad parameters {params}: {e}") from None


def train_checkpoint(name: str, **kwargs) -> dict:
    """Train a learned method's checkpoint (its module's `train_checkpoint`); returns its eval proxy."""
    return method_module(name, "train_checkpoint").train_checkpoint(**kwargs)


def export_vllm(name: str, **kwargs) -> None:
    """Write a learned method's checkpoint in the layout vLLM loads (its module's `export_vllm`)."""
    method_module(name, "export_vllm").export_vllm(**kwargs)


def source_files(name: str) -> list[Path]:
    """The files a method's benchmark depends on (its module or package)."""
    here = Path(__file__).parent
    rel = METHODS[name].split(".")[-1]
    pkg = here / rel
    return sorted(pkg.rglob("*.py")) if pkg.is_dir() else [here / f"{rel}.py"]
