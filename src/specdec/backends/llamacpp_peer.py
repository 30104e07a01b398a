"""llama.cpp as a peer arm of our loop's job (methods/peers.py: llamacpp_generate, llamacpp_lookup),
opt-in: the workflow builds llama.cpp from its PyPI source distribution (workflow/rules/llamacpp.smk)
outside the default install, and a config that names a llama.cpp peer (workflow/configs/llamacpp.yaml)
adds the build to the held-out job's inputs.

The job converts its checkpoint, in the job's dtype, to a GGUF file with llama.cpp's own
convert_hf_to_gguf.py (untimed, in a temporary directory removed when the arm's server is closed),
and starts one `llama-server` per arm on it with the job's thread count, one slot, a context that
admits the job's longest prompt and no prompt cache, so every request prefills its prompt as our
loop does. A prompt is one /completion request of token ids (no BOS added), greedy (temperature
0), stopping at llama.cpp's end-of-generation tokens (the checkpoint's, as the GGUF carries them)
or after n tokens; its wall time is the request's, submission to the response. llama.cpp's
threads poll for work between graph computes (`--poll`, default 50): the arm sets 0 by default, so an idle server
spins on no core while another arm is timed.
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import torch

from ..core.loop import DecodeResult
from .llamacpp_build import build_paths

GGUF_TYPES = {"bfloat16": "bf16", "float32": "f32", "float16": "f16"}
START_TIMEOUT_S = 120


def convert_gguf(build: str | os.PathLike, checkpoint: str | os.PathLike, dtype: str, out: str | os.PathLike) -> Path:
    """A Hugging Face checkpoint as a GGUF file of `dtype`'s type, by llama.cpp's converter."""
    if dtype not in GGUF_TYPES:
        raise ValueError(f"llama.cpp peer: no GGUF type for dtype {dtype!r}; expected one of {sorted(GGUF_TYPES)}")
    paths = build_paths(build)
    path = os.pathsep.join(filter(None, [str(paths["gguf_py"]), os.environ.get("PYTHONPATH")]))
    cmd = [sys.executable, str(paths["convert"]), str(checkpoint), "--outtype", GGUF_TYPES[dtype],
           "--outfile", str(out)]
    env = dict(os.environ, PYTHONPATH=path)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp's convert_hf_to_gguf.py failed on {checkpoint} ({dtype}):\n"
                           f"{done.stderr[-3000:]}")
    return Path(out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class Server:
    """One llama-server process on a GGUF file; stop() (or interpreter exit) ends it, and close()
    also removes `owned`, a temporary directory of its files (the GGUF, the log), if given."""

    def __init__(self, server: Path, gguf: Path, threads: int, context: int, args: list[str], log_dir: Path,
                 owned: tempfile.TemporaryDirectory | None = None):
        self.owned = owned
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
               "-t", str(threads), "-tb", str(threads), "-c", str(context), "-np", "1",
               "--no-webui", "--cache-ram", "0", *args]
        self.cmd = cmd
        self.log = Path(log_dir) / f"server-{self.port}.log"
        self._out = open(self.log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT)
        atexit.register(self.stop)
        self._wait_ready()

    def _wait_ready(self) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < START_TIMEOUT_S:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode} at start "
                                   f"({' '.join(self.cmd)}):\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama-server did not become ready in {START_TIMEOUT_S} s; log: {self.log}")

    def complete(self, prompt_ids: list[int], n: int) -> dict:
        body = {"prompt": list(prompt_ids), "n_predict": n, "temperature": 0.0, "cache_prompt": False,
                "return_tokens": True, "stream": False}
        return _post(f"{self.url}/completion", body, timeout=600)

    def close(self) -> None:
        self.stop()
        if self.owned is not None:
            self.owned.cleanup()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if not self._out.closed:
            self._out.close()


def server_args(params: dict) -> list[str]:
    """llama-server's command-line options for a peer variant's parameters (methods/peers.py)."""
    args = ["--poll", str(params.get("poll", 0))]
    if "spec_type" in params:
        args += ["--spec-type", str(params["spec_type"])]
    for key, value in sorted(params.items()):
        if key.startswith("spec_") and key != "spec_type":
            args += ["--" + key.replace("_", "-"), str(value)]
    return args


def llamacpp_runner(build: str, target_dir: str, dtype: torch.dtype, threads: int, context: int,
                    params: dict, workdir: str | os.PathLike | None = None):
    """run(prompt_ids, index, n) -> DecodeResult, and the server (call .close()). workdir: where
    the GGUF and the server's log go (None: a temporary directory that close() removes).
    The GGUF conversion and the server's start are not timed."""
    name = str(dtype).removeprefix("torch.")
    owned = None if workdir else tempfile.TemporaryDirectory(prefix="specdec-llamacpp-")
    work = Path(workdir or owned.name)
    gguf = work / f"target-{GGUF_TYPES.get(name, name)}.gguf"
    if not gguf.exists():
        convert_gguf(build, target_dir, name, gguf)
    server = Server(build_paths(build)["server"], gguf, threads, context, server_args(params), work, owned)

    def run(prompt_ids: list[int], index: int, n: int) -> DecodeResult:
        t0 = time.perf_counter()
        out = server.complete(prompt_ids, n)
        wall = time.perf_counter() - t0
        first = (out.get("timings") or {}).get("prompt_ms")
        return DecodeResult(list(out["tokens"]), wall, ttft_s=None if first is None else first / 1000,
                            draft_s=None, fused_first_step=False, drafted=None, accepted=None, depth=None)
    return run, server
