"""The one training job of every learned proposer.

The driver does what every method shares: load the frozen target and the hidden-state cache,
check that the cache was made by this target, seed, draw batches (a fresh permutation of the
examples every epoch), run the resumable loop (warm-up, cosine schedule, clipping, resume; see
loop.py), evaluate the proxy on the train-overlap slice and the held-out split (every
`eval_every` steps into the log, and at the end), save, and drop the resume state. A method
supplies only `setup(target, data, settings, tcfg, device) -> Trainee`: its module, how many
examples it draws from, its loss on a batch of them, its evaluation and how it saves.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace

import torch
from torch import nn

from ..models import load_causal_lm
from . import loop
from .checkpoint import checkpoint_record
from .hidden import HiddenStates, Sequence


@dataclass
class TrainData:
    """The cached target states a method trains on: sequences of the train and held-out splits
    (token ids, prompt length, the requested hidden-state taps)."""
    train: list[Sequence]
    heldout: list[Sequence]
    overlap: int          # the first `overlap` train sequences are the train-overlap eval slice

    def eval_splits(self) -> dict[str, list[Sequence]]:
        return {"overlap": self.train[: self.overlap], "heldout": self.heldout}


@dataclass
class Trainee:
    """What a method hands the driver."""
    module: nn.Module                     # only parameters with requires_grad are trained
    examples: int                         # size of the set the sampler permutes every epoch
    loss: Callable[[nn.Module, list[int], int], tuple[torch.Tensor, dict]]  # (module, example ids, step)
    evaluate: Callable[[nn.Module], dict]                                    # -> eval proxy
    save: Callable[[str, dict, list[dict], dict], None]  # (out_dir, train config, log, eval proxy)
    settings: dict = field(default_factory=dict)          # the method's settings: part of the run's identity
    describe: str = ""                                    # one line printed before training


def epoch_order(n: int, epoch: int, seed: int) -> list[int]:
    """The permutation of epoch `epoch`: seeded by (seed, epoch), so a resumed run draws the same
    batches and every epoch visits the examples in a new order."""
    gen = torch.Generator().manual_seed(seed + 1_000_003 * epoch)
    return torch.randperm(n, generator=gen).tolist()


def batch_indices(step: int, batch_size: int, n: int, seed: int) -> list[int]:
    """Example ids of one step: steps walk the concatenation of the epochs' permutations."""
    start = step * batch_size
    out = []
    while len(out) < batch_size:
        epoch, offset = divmod(start + len(out), n)
        order = epoch_order(n, epoch, seed)
        out += order[offset: offset + batch_size - len(out)]
    return out


def frozen_target(target, dtype: str, device: str):
    """The target loaded again in the compute dtype on the device, frozen: for a method that runs
    target modules in training (loading keeps the rotary frequencies in fp32, as inference does;
    casting the fp32 model would round them)."""
    model = load_causal_lm(target.name_or_path, dtype, device)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _prepare(method, hidden_path: str, target_dir: str, settings: dict, overlap: int):
    tcfg = loop.TrainConfig(**settings.get("train", {}))
    # on the CPU in fp32: a method loads what it runs in training on the device itself (frozen_target)
    target = load_causal_lm(target_dir, "float32")
    for p in target.parameters():
        p.requires_grad_(False)
    hs = HiddenStates(hidden_path)
    hs.check_target(target.config)
    taps = method.hidden_taps(target.config, settings)
    soft = tcfg.soft_labels
    train, heldout = hs.split("train", taps, tcfg.records, soft), hs.split("heldout", taps, soft=soft)
    if tcfg.features == "post_norm":
        post_norm_last_tap(train + heldout, target)
    elif tcfg.features != "pre_norm":
        raise ValueError(f"train.features: {tcfg.features!r} is not one of pre_norm, post_norm")
    return tcfg, target, hs, TrainData(train, heldout, overlap)


@torch.no_grad()
def post_norm_last_tap(seqs: list[Sequence], target) -> None:
    """Replace tap num_layers by norm(tap), the target's final norm applied (in fp32, stored back in
    the cache's dtype): the features the cache held before the feature fix, which the decoding loop
    never serves. The ablation's "before" rows train on them (docs/ablation.md)."""
    last, norm = target.config.num_hidden_layers, target.model.norm
    for s in seqs:
        if last in s.taps:
            h = s.taps[last]                          # (n, hidden), a view of the mapped file
            s.taps[last] = norm(h.float()).to(h.dtype)


def mixed_precision(trainee: Trainee, tcfg, device: str) -> Trainee:
    """Train in `tcfg.dtype` with fp32 master weights: the trainable parameters are kept in fp32 (so
    AdamW's small updates are not rounded away) and, for a bf16 run, every loss and evaluation runs
    under autocast (matmuls in bf16, the method's frozen target parts stay in bf16)."""
    for p in trainee.module.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    if tcfg.dtype != "bfloat16":
        return trainee

    def loss(module, idx, step):
        with autocast(tcfg.dtype, device):
            return trainee.loss(module, idx, step)

    def evaluate(module):
        with autocast(tcfg.dtype, device):
            return trainee.evaluate(module)
    return replace(trainee, loss=loss, evaluate=evaluate)


def autocast(dtype: str, device: str):
    """bf16 autocast for a bf16 run (matmuls in bf16 over fp32 master weights); nothing otherwise."""
    if dtype != "bfloat16":
        return nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


PROBE_STEPS = 2          # timed training steps per dtype when `auto` has two candidates
PROBE_MARGIN = 1.15      # fp32 replaces the speed dtype only when this much faster per step


def _seconds_per_step(method, target, data, settings: dict, tcfg, device: str) -> float:
    """A throwaway copy of the run in tcfg.dtype: one untimed step, then the mean of PROBE_STEPS
    (forward and the loop's optimizer step) on the run's own first batches."""
    torch.manual_seed(tcfg.seed)
    trainee = mixed_precision(method.setup(target, data, settings, tcfg, device), tcfg, device)
    module = trainee.module.train()
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tcfg.lr)
    elapsed = 0.0
    for step in range(1 + PROBE_STEPS):
        t0 = time.perf_counter()
        loss, _ = trainee.loss(module, batch_indices(step, tcfg.batch_size, trainee.examples, tcfg.seed), step)
        loop.optimizer_step(loss, opt, params, tcfg.max_grad_norm)
        if step:
            elapsed += time.perf_counter() - t0
    return elapsed / PROBE_STEPS


def choose_dtype(method, target, data, settings: dict, tcfg, device: str) -> tuple[str, str]:
    """(dtype, reason) for `auto`: the host's speed dtype (host.speed_dtype), unless fp32 trains
    faster here. Inference and training disagree on some CPUs: autograd's bf16 kernels (the
    backward's transposed matmuls, AdamW on bf16 tensors) are fast on some bf16-native CPUs and
    slower than fp32 on others, so where the speed dtype is bf16 both are timed on the run's
    own first batches."""
    from ..host import speed_dtype
    speed, why = speed_dtype(device)
    if speed == "float32":
        return speed, why
    t = {dt: _seconds_per_step(method, target, data, settings, replace(tcfg, dtype=dt), device)
         for dt in (speed, "float32")}
    timing = f"{speed} {t[speed]:.2f} s/step, float32 {t['float32']:.2f} s/step ({PROBE_STEPS} probe steps each)"
    if t["float32"] * PROBE_MARGIN < t[speed]:
        return "float32", f"fp32 trains faster on this host: {timing}"
    return speed, f"{why}; {timing}"


def train_checkpoint(method, *, hidden_path: str, target_dir: str, out_dir: str, settings: dict,
                     overlap: int, device: str = "cpu") -> dict:
    """Train `method` (its module: `hidden_taps(config, settings)` and `setup(...)`) and save the
    checkpoint in `out_dir`; returns the eval proxy. The train dtype `auto` is chosen here
    (choose_dtype), and the checkpoint records the choice and why."""
    tcfg, target, hs, data = _prepare(method, hidden_path, target_dir, settings, overlap)
    requested, reason = tcfg.dtype, "set in the config"
    if requested == "auto":
        dtype, reason = choose_dtype(method, target, data, settings, tcfg, device)
        tcfg = replace(tcfg, dtype=dtype)
    print(f"train dtype: {tcfg.dtype} ({requested}: {reason})", flush=True)
    torch.manual_seed(tcfg.seed)   # initialisation is part of the run: a rerun starts identically
    trainee = mixed_precision(method.setup(target, data, settings, tcfg, device), tcfg, device)

    def loss_fn(module, step):
        return trainee.loss(module, batch_indices(step, tcfg.batch_size, trainee.examples, tcfg.seed), step)

    run_id = loop.fingerprint(loop.run_settings(tcfg), trainee.settings, hs.meta, trainee.examples)
    print(f"{method.NAME}: {trainee.describe}; {trainee.examples} examples, {tcfg.steps} steps of {tcfg.batch_size}")
    log = loop.train(trainee.module, loss_fn, tcfg, out_dir, run_id, desc=method.NAME, evaluate=trainee.evaluate)
    with torch.no_grad():
        eval_proxy = trainee.evaluate(trainee.module)
    with autocast(tcfg.dtype, device):   # a save may measure the module (Medusa's rank accuracies)
        trainee.save(out_dir, {**asdict(tcfg), "dtype_requested": requested, "dtype_reason": reason,
                               "master_weights": "float32", "train_records": len(data.train)}, log, eval_proxy)
    loop.finish(out_dir)
    return eval_proxy


def reevaluate(method, ckpt_dir: str, *, hidden_path: str, target_dir: str, settings: dict, overlap: int,
               device: str = "cpu") -> dict:
    """A saved checkpoint's eval proxy, computed again: the method's evaluation on the same data,
    with the module its own loader reads from `ckpt_dir`."""
    tcfg, target, _, data = _prepare(method, hidden_path, target_dir, settings, overlap)
    if tcfg.dtype == "auto":   # the dtype the checkpoint was trained in (the choice `auto` made)
        tcfg = replace(tcfg, dtype=checkpoint_record(ckpt_dir)[1]["train"]["dtype"])
    trainee = method.setup(target, data, settings, tcfg, device)
    # as training evaluated it: fp32 weights, bf16 matmuls under autocast in a bf16 run
    module = method.load_module(ckpt_dir, target).to(device, torch.float32).eval()
    with torch.no_grad(), autocast(tcfg.dtype, device):
        return trainee.evaluate(module)
