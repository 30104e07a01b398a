"""One resumable training loop for every learned proposer.

A method supplies its module (only its trainable parameters get gradients), `loss_fn(module,
step) -> (loss, metrics)` and a fingerprint of everything that defines the run (settings, data,
target). Every `save_every` steps the loop writes `resume.pt` atomically (module, optimizer,
step, log); a rerun with the same fingerprint continues from there, a different fingerprint
starts over and says so.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..data.records import atomic_path


@dataclass
class TrainConfig:
    steps: int = 200
    batch_size: int = 16
    lr: float = 1e-3
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    warmup_steps: int = 10
    save_every: int = 50
    log_every: int = 10
    eval_every: int = 0       # steps between evaluations of the eval proxy (logged); 0: at the end only
    records: int | None = None  # train on the first N training records (None: all)
    seed: int = 0
    soft_labels: bool = False   # distil the target's top-K distribution (train/soft.py; the cache's soft_topk)
    # tap num_layers as training reads it: "pre_norm", the state the decoding loop and vLLM serve
    # (core.target); "post_norm", after the target's final norm, as the cache stored it before the
    # feature fix (train and serve differ: only for the ablation, docs/ablation.md)
    features: str = "pre_norm"
    dtype: str = "float32"    # parameter/compute dtype; "auto": the driver times the candidates (driver.choose_dtype)


# how often the loop saves, logs and evaluates: not what it trains, so a resume may change them
SCHEDULE_KEYS = ("save_every", "log_every", "eval_every")


def run_settings(cfg: TrainConfig) -> dict:
    """The fields of `cfg` that decide the trained weights: the run's part of its fingerprint."""
    return {k: v for k, v in asdict(cfg).items() if k not in SCHEDULE_KEYS}


def fingerprint(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to 10% of lr."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def _save(path: Path, state: dict) -> None:
    with atomic_path(path) as tmp:   # an interrupted save never leaves a torn resume file
        torch.save(state, tmp)


def optimizer_step(loss: torch.Tensor, opt: torch.optim.Optimizer, params: list, max_grad_norm: float):
    """Backward, clip to max_grad_norm (0: no clipping), step; returns the gradient norm (or None)."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm) if max_grad_norm else None
    opt.step()
    return grad_norm


def train(module: torch.nn.Module, loss_fn: Callable[[torch.nn.Module, int], tuple[torch.Tensor, dict]],
          cfg: TrainConfig, out_dir: str | os.PathLike, run_id: str, desc: str = "train",
          evaluate: Callable[[torch.nn.Module], dict] | None = None) -> list[dict]:
    """Train `module` in place for cfg.steps; returns the log (one dict per logged step, with
    elapsed_s counting the training time of every resumed part). Every cfg.eval_every steps
    (before the last), `evaluate(module)` runs in eval mode without gradients and its result is
    logged under "eval" (its time is not counted in elapsed_s)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    resume = out / "resume.pt"
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    start, log, spent = 0, [], 0.0
    if resume.exists():
        state = torch.load(resume, map_location="cpu", weights_only=False)
        if state.get("run_id") == run_id:
            module.load_state_dict(state["module"], strict=False)
            opt.load_state_dict(state["optimizer"])
            start, log, spent = state["step"], state["log"], state["seconds"]
            torch.set_rng_state(state["rng"])
            print(f"{resume}: resuming at step {start}/{cfg.steps}")
        else:
            print(f"{resume}: saved for a different run (settings, data or target changed); starting over")
    if start == 0:
        torch.manual_seed(cfg.seed)

    module.train()
    t0, window = time.perf_counter(), []
    bar = tqdm(range(start, cfg.steps), desc=desc, unit="step", initial=start, total=cfg.steps)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        loss, metrics = loss_fn(module, step)
        grad_norm = optimizer_step(loss, opt, params, cfg.max_grad_norm)
        window.append({"loss": loss.item(), **metrics})
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            row = {"step": step + 1, "lr": lr_at(step, cfg), "elapsed_s": spent + time.perf_counter() - t0,
                   "grad_norm": None if grad_norm is None else float(grad_norm)}
            row.update({k: sum(w[k] for w in window) / len(window) for k in window[0]})
            log.append(row)
            window = []
            bar.set_postfix(loss=f"{row['loss']:.3f}")
        if evaluate is not None and cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
            t_eval = time.perf_counter()
            module.eval()
            with torch.no_grad():
                log.append({"step": step + 1, "eval": evaluate(module)})
            module.train()
            t0 += time.perf_counter() - t_eval
        if (step + 1) % cfg.save_every == 0 and step + 1 < cfg.steps:
            _save(resume, {"run_id": run_id, "module": {k: v for k, v in module.state_dict().items()},
                           "optimizer": opt.state_dict(), "step": step + 1, "log": log,
                           "rng": torch.get_rng_state(), "config": asdict(cfg),
                           "seconds": spent + time.perf_counter() - t0})
    module.eval()
    return log


def finish(out_dir: str | os.PathLike) -> None:
    """The checkpoint is written: the resume state is no longer needed."""
    resume = Path(out_dir) / "resume.pt"
    if resume.exists():
        resume.unlink()
