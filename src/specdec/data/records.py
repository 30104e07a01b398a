"""Record IO: JSONL / JSON written atomically, read with errors that name the file and line;
`atomic_path`, the one way every artifact of the project is written."""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

# the fields every prompt record carries (the reference system's, plus id/dataset/split)
PROMPT_FIELDS = ("id", "prompt", "prompt_ids")
COMPLETION_FIELDS = ("completion_ids", "completion_text")


class RecordError(ValueError):
    pass


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary sibling of `path` for the block to write (a file or a directory). When the
    block succeeds it replaces `path`; when it fails it is removed: readers never see half an
    artifact, and an interrupted job leaves nothing that looks finished."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    _remove(tmp)
    try:
        yield tmp
        if path.is_dir():
            shutil.rmtree(path)   # os.replace cannot replace a non-empty directory
        os.replace(tmp, path)
    finally:
        _remove(tmp)


def _atomic_write(path: str | os.PathLike, write) -> None:
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        write(f)


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


def read_prompts(path, limit: int | None = None, skip: int = 0) -> list[dict]:
    """Prompt records, checked: prompt_ids must be a non-empty list of ints. `skip`: leave out the
    first records (a split after them); then the file must hold `limit` records past them."""
    records = read_jsonl(path, PROMPT_FIELDS)
    for lineno, r in enumerate(records, start=1):
        ids = r["prompt_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            raise RecordError(f"{path}: record {lineno} (id {r.get('id')!r}): field prompt_ids "
                              "must be a non-empty list of token ids")
    if skip:
        if len(records) < skip + (limit or 1):
            raise RecordError(f"{path}: {len(records)} records; the split after the first {skip} needs "
                              f"{limit or 1} more")
        records = records[skip:]
    return records[:limit] if limit is not None else records
