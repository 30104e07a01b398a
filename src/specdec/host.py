"""The host's compute capability, and the speed dtype it implies.

`auto` in the config (benchmarks, vLLM, distillation, hidden states, training) resolves here, in
the job, on the machine that runs it:
- a CUDA device, or a CPU whose cores multiply bf16 natively (AMX or AVX-512 BF16): bfloat16;
- any other CPU (AVX2 only, or AVX-512 without BF16): float32. There oneDNN emulates bf16
  matmuls, so a forward's cost grows with its token count (16 new tokens cost ~5.7x one on a
  2-core AVX2 host, against ~1.3x on a bf16-native one): verifying drafts in bf16 would cost more
  than decoding them one by one, and fp32 is faster outright.
Training starts from the same choice, but where it says bf16 the training job also times a few
steps in fp32 and keeps the faster (train/driver.py, choose_dtype): autograd's bf16 CPU kernels
are fast on some bf16-native CPUs and slower than fp32 on others.
Every summary and checkpoint records `capability()` and the choice with its reason, and every
summary the host's measured memory read bandwidth (`memory_read_gb_s`): a decode step of a small
model on a CPU reads every weight once, so weight bytes / bandwidth is the floor of a step.
"""
from __future__ import annotations

import copy
import functools
import os
import platform
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")   # /proc/cpuinfo flags of native bf16 matmuls


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def isa_level() -> str:
    """torch's CPU kernel level: "AVX2", "AVX512", ... ("DEFAULT" without vector units)."""
    import torch
    return torch.backends.cpu.get_cpu_capability()


def capability() -> dict:
    flags = cpu_flags()
    bf16 = sorted(f for f in NATIVE_BF16_FLAGS if f in flags)
    return {"cpu_model": cpu_model(), "isa": isa_level(), "native_bf16": bool(bf16), "bf16_flags": bf16}


@functools.lru_cache(maxsize=1)
def memory_read_gb_s(mib: int = 512, repeats: int = 5) -> float:
    """The host's memory read bandwidth in GB/s, as torch's threads see it: the best of `repeats`
    sums over a `mib` MiB float32 buffer (far larger than any cache), measured once per process."""
    import torch
    x = torch.ones(mib * 2**20 // 4)
    x.sum()   # fault the pages in
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best / 1e9


def speed_dtype(device: str = "cpu", cap: dict | None = None) -> tuple[str, str]:
    """(dtype, reason): the dtype a timed run uses on this host."""
    if device.startswith("cuda"):
        return "bfloat16", "CUDA device: bf16 tensor cores"
    cap = cap if cap is not None else capability()
    if cap["native_bf16"]:
        return "bfloat16", f"CPU multiplies bf16 natively ({', '.join(cap['bf16_flags'])}; ISA {cap['isa']})"
    return "float32", (f"CPU has no native bf16 matmul (ISA {cap['isa']}, no {' / '.join(NATIVE_BF16_FLAGS)}): "
                       "bf16 is emulated and verification cost grows with the draft")


def resolve_dtype(name: str, device: str = "cpu") -> str:
    """A configured dtype: `auto` becomes this host's speed dtype; any other name is kept."""
    return speed_dtype(device)[0] if name == "auto" else name


# dtype names -> torch's (torch is imported where a dtype is made: the Snakefile imports this module)
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def set_threads(n: int) -> int:
    """torch intra-op threads: n, or every core this process may use when n == 0. Snakemake
    exports OMP_NUM_THREADS=1 (its default `threads: 1`) to every job, and with `--cores 1` the
    jobs run one at a time, so 0 must set the count explicitly rather than inherit that 1."""
    import torch

    n = n or available_cores()
    torch.set_num_threads(n)
    return n


def torch_dtype(name: str, device: str = "cpu") -> torch.dtype:
    """A dtype name as torch's; `auto` is this host's speed dtype (speed_dtype)."""
    import torch

    name = resolve_dtype(name, device)
    try:
        return getattr(torch, DTYPES[name])
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}") from None


def dtype_record(requested: str, device: str = "cpu") -> dict:
    """What a summary says about its dtype: the requested name, the one used, and why."""
    if requested == "auto":
        used, why = speed_dtype(device)
        return {"dtype_requested": "auto", "dtype": used, "dtype_reason": why}
    return {"dtype_requested": requested, "dtype": requested, "dtype_reason": "set in the config"}


def sizing(config: dict) -> tuple[str, dict]:
    """(host class, overrides): the config's `sizing` section read for the machine that plans the
    DAG. `sizing.host` names the class (bfloat16 or float32); `auto` takes this machine's speed
    dtype for `device`. The overrides are `sizing.<class>` (a partial config merged over the rest;
    empty where the config sizes nothing for that class)."""
    spec = config.get("sizing") or {}
    cls = spec.get("host", "auto")
    if cls == "auto":
        cls = speed_dtype(config.get("device", "cpu"))[0]
    return cls, copy.deepcopy(spec.get(cls) or {})
