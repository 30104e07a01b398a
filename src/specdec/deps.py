"""The project files a job's code depends on, computed from the import graph.

A job runs one module: `python -m specdec <verb>` parses its arguments (cli.py, which reads the
method registry for its choices) and calls one function of that module. Its code inputs are the
files Python loads for it:
- the job's module, with every project import in it, at the top of the file or inside one of its
  functions (a job runs its module's functions; optional engines are imported lazily there);
- for every other project module reached, its top-level imports (what importing it loads), with
  the `__init__.py` of each package on the way, transitively;
- the CLI: `__main__.py`, `cli.py` and the registry (`methods/__init__.py`).
Imports inside another module's functions are not followed: the registry's training and export
helpers, for example, import the trainer lazily, and a benchmark that only builds proposers never
loads it. A method's own module is imported by name (methods.module), which no import statement
shows: the workflow adds it per job from methods.source_files, computed here with the method
module as a job's module. tests/test_workflow.py checks, on the smoke DAG, that every project
module a job really loaded is among its code inputs. The one rule without code inputs is
fetch_wheel: a pinned download, which an edit should not fetch again.
"""
from __future__ import annotations

import ast
import os
from functools import cache
from pathlib import Path

PACKAGE = "specdec"
ROOT = Path(__file__).resolve().parent          # src/specdec
CLI = f"{PACKAGE}.cli"
CLI_MODULES = (f"{PACKAGE}.__main__", CLI, f"{PACKAGE}.methods")


def module_path(name: str) -> Path | None:
    """specdec.core.loop -> src/specdec/core/loop.py (a package: its __init__.py); None outside
    the project or where no such file exists."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    base = ROOT.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def module_name(path: Path) -> str:
    parts = list(path.resolve().relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _packages(name: str) -> list[str]:
    """The packages Python imports before `name`: specdec.core.loop -> specdec, specdec.core."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imported(node: ast.AST, package: str) -> set[str]:
    """The modules one import statement names (`from pkg import sub`: pkg and pkg.sub)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if node.level:
        anchor = package.split(".")
        anchor = anchor[:len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return {base, *(f"{base}.{alias.name}" for alias in node.names)}


def _walk_outside_functions(node: ast.AST):
    """The nodes of a module body that run on import: not the bodies of functions."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        yield child
        yield from _walk_outside_functions(child)


@cache
def imports(path: Path, in_functions: bool = False) -> tuple[str, ...]:
    """Project modules the file at `path` imports on import, and with in_functions also those
    its functions import."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = ast.walk(tree) if in_functions else _walk_outside_functions(tree)
    found = set()
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= _imported(node, package)
    return tuple(sorted(m for m in found if module_path(m) is not None))


def closure(*modules: str, imported: tuple[str, ...] = ()) -> list[Path]:
    """The project files that running `modules` loads: each module with every import in it (top
    level and functions), then the top-level imports of everything reached, with the packages'
    __init__.py files, transitively. `imported`: modules only imported, not run."""
    missing = [m for m in (*modules, *imported) if module_path(m) is None]
    if missing:
        raise ValueError(f"not a project module: {', '.join(missing)}")
    todo = [m2 for m in modules for m2 in imports(module_path(m), in_functions=True)] + [*modules, *imported]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [p for p in _packages(name) if module_path(p) is not None]
        todo += imports(module_path(name))
    return sorted(module_path(m) for m in seen)


def _cli_functions() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(module_path(CLI).read_text(), filename=str(module_path(CLI)))
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def verb_modules(verb: str) -> list[str]:
    """The project modules `python -m specdec <verb>` runs: those its cmd_<verb> function in
    cli.py imports, and those of the cli.py helpers it calls, transitively."""
    functions = _cli_functions()
    name = "cmd_" + verb.replace("-", "_")
    if name not in functions:
        raise ValueError(f"{module_path(CLI)}: no {name} for the verb {verb!r}")
    todo, seen, found = [name], set(), set()
    while todo:
        fn = todo.pop()
        if fn in seen:
            continue
        seen.add(fn)
        for node in ast.walk(functions[fn]):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found |= _imported(node, PACKAGE)
            elif isinstance(node, ast.Name) and node.id in functions:
                todo.append(node.id)
    return sorted(m for m in found if module_path(m) is not None and m != PACKAGE)


def verb_code(verb: str) -> list[str]:
    """A job's code inputs, as absolute paths (a rule lists them through as_inputs): the files
    `python -m specdec <verb>` loads: the CLI and the registry it reads, and the modules the verb
    runs with everything they load."""
    return [str(p) for p in closure(*verb_modules(verb), imported=CLI_MODULES)]


def module_code(module: str) -> list[str]:
    """The files running `module` loads (a method's module, imported by name by the registry)."""
    return [str(p) for p in closure(module)]


def as_inputs(paths: list[str], root: str | Path | None = None) -> list[str]:
    """Paths as a rule lists them: relative to `root` (default: the working directory, against
    which Snakemake resolves a relative input) where they lie inside it, else absolute. Snakemake
    records each output's inputs by name, so an absolute name would make every job stale in a
    moved or re-cloned checkout."""
    root = Path(root or os.getcwd()).resolve()
    out = []
    for p in paths:
        path = Path(p).resolve()
        out.append(str(path.relative_to(root)) if path.is_relative_to(root) else str(path))
    return out
