"""Record IO: JSONL / JSON written atomically, read with errors that name the file and line."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Iterable

# the fields every prompt record carries (the reference system's, plus id/dataset/split)
PROMPT_FIELDS = ("id", "prompt", "prompt_ids")
COMPLETION_FIELDS = ("completion_ids", "completion_text")


class RecordError(ValueError):
    pass


def _atomic_write(path: str | os.PathLike, write) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
    try:
        with os.fdopen(fd, "w") as f:
            write(f)
        os.replace(tmp, path)  # readers never see a half-written file
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_jsonl(path, records: Iterable[dict]) -> None:
    def write(f):
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    _atomic_write(path, write)


def write_json(path, obj) -> None:
    _atomic_write(path, lambda f: f.write(json.dumps(obj, indent=2, ensure_ascii=False) + "\n"))


def write_text(path, text: str) -> None:
    _atomic_write(path, lambda f: f.write(text))


def read_json(path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise RecordError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise RecordError(f"{path}: line {e.lineno}: malformed JSON ({e.msg})") from None


def read_jsonl(path, required: tuple[str, ...] = ()) -> list[dict]:
    records = []
    try:
        f = open(path)
    except FileNotFoundError:
        raise RecordError(f"{path}: file not found") from None
    with f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise RecordError(f"{path}: line {lineno}: malformed JSON ({e.msg})") from None
            if not isinstance(r, dict):
                raise RecordError(f"{path}: line {lineno}: expected a JSON object, got {type(r).__name__}")
            missing = [k for k in required if k not in r]
            if missing:
                raise RecordError(f"{path}: line {lineno}: missing field(s) {', '.join(missing)}")
            records.append(r)
    return records


def read_prompts(path, limit: int | None = None) -> list[dict]:
    """Prompt records, checked: prompt_ids must be a non-empty list of ints."""
    records = read_jsonl(path, PROMPT_FIELDS)
    for lineno, r in enumerate(records, start=1):
        ids = r["prompt_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            raise RecordError(f"{path}: record {lineno} (id {r.get('id')!r}): field prompt_ids "
                              "must be a non-empty list of token ids")
    return records[:limit] if limit is not None else records
