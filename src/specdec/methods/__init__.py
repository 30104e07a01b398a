"""The method registry: name -> module, found by the NAME each module of this package declares.
A method's module is the one place that defines it:

    NAME            its registry name
    PARAMS          the dataclass of a variant's parameters (config.yaml methods.<name>.variants)
    build(params, target) -> Proposer
    CONTROL         (optional) True for a negative control (the null drafter): drafts that are
                    never meant to be accepted
    EXAMPLE         {"params": a small variant, "train": (learned) its training settings,
                    "vllm_params": (optional) the variant vLLM serves}: the contract tests' and
                    the docs' example
    tuning_grid(params) -> {parameter: [values]}   (optional) what a tuned variant of this variant
                    may change, one parameter at a time (backends/tuning.py picks the value)
  learned methods, trained by train/driver.py:
    TRAIN_SETTINGS  settings section -> dataclass (besides "train", the shared loop's)
    hidden_taps(config, settings), setup(target, data, settings, tcfg, device) -> Trainee
    load_module(checkpoint, target_model)    the trained module, as inference loads it
    EXAMPLES        (optional) what a training example is: "records" (default; a batch draws
                    records) or "positions" (Medusa: a batch draws single positions)
  served by vLLM:
    VLLM            a VllmServing: whether vLLM loads an export, and how; whether our own
                    proposer can run inside vLLM's scheduler (the custom proposer hook)
    vllm_config(params, export_dir) -> vLLM's speculative_config
    export_vllm(ckpt_dir, target_dir, out_dir), when VLLM.export is set

The registry checks each module's parts when it finds it (check_parts): every method's, all the
learned parts once one is declared, and vllm_config (export_vllm where VLLM names an export) for
a method vLLM serves; a missing one is an error naming the module and the part.

The core never imports from here; the backends, the CLI and the workflow's planner (specdec.plan) read it.
The peers (other engines: HF `generate`, vLLM) are declared in peers.py (PEERS) and run by
backends/hf_generate.py and backends/vllm_peer.py.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
from dataclasses import dataclass
from pathlib import Path

from .peers import PEERS  # the peers (HF `generate`, vLLM): which engine runs each, what it takes

# the parts a method module declares (the docstring above says what each is): every method's;
# a learned method's, all of them once it declares any; and what a method vLLM serves needs
REQUIRED = ("NAME", "PARAMS", "EXAMPLE", "build")
LEARNED = ("TRAIN_SETTINGS", "hidden_taps", "setup", "load_module")
SERVED = ("vllm_config",)


def _declared(tree: ast.Module) -> set[str]:
    """The names a module binds at top level: definitions, assignments and imports."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
    return names


def _assigned(tree: ast.Module, name: str) -> ast.expr | None:
    """The value of the module's top-level `name = ...`, or None."""
    return next((node.value for node in tree.body if isinstance(node, ast.Assign)
                 and [getattr(t, "id", None) for t in node.targets] == [name]), None)


def _exports(tree: ast.Module) -> bool:
    """Whether the module's VLLM = VllmServing(...) names an export (export="draft"/"model")."""
    value = _assigned(tree, "VLLM")
    return isinstance(value, ast.Call) and any(
        k.arg == "export" and not (isinstance(k.value, ast.Constant) and k.value.value is None) for k in value.keywords)


def check_parts(path: Path, tree: ast.Module) -> None:
    """A method module declares every part its kind needs; raises naming the module and the parts."""
    names = _declared(tree)
    missing = [p for p in REQUIRED if p not in names]
    learned = [p for p in LEARNED if p in names]
    if learned:   # one learned part makes it a learned method: a forgotten setup is an error, not training-free
        missing += [p for p in LEARNED if p not in names]
    if "VLLM" in names:
        missing += [p for p in SERVED if p not in names]
        if _exports(tree) and "export_vllm" not in names:
            missing.append("export_vllm")
    if missing:
        kind = f" (a learned method: it declares {', '.join(learned)})" if learned else ""
        raise ValueError(f"{path}: method module lacks {', '.join(missing)}{kind}")


def _discover(directory: Path = Path(__file__).parent, package: str = __name__) -> dict[str, str]:
    """name -> module for every module of the package that declares a top-level `NAME = "..."`,
    read from its source (nothing is imported): adding a method is adding its file. Code shared
    by methods (draft_lm.py) and the peers (peers.py) declare no NAME. Each method module is
    checked for the parts its kind needs (check_parts)."""
    found = {}
    for path in sorted(directory.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        value = _assigned(tree, "NAME")
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            if value.value in found:
                raise ValueError(f"{path}: NAME {value.value!r} is already {found[value.value]}'s")
            check_parts(path, tree)
            found[value.value] = f"{package}.{path.stem}"
    return found


METHODS = _discover()   # ngram, suffix, medusa, mtp, draft_model, pard, eagle3, null_drafter (a control)

# keys of a config variant that select where it runs; the rest are the method's parameters
VARIANT_SCOPE = ("datasets", "dtypes")


@dataclass(frozen=True)
class VllmServing:
    """How vLLM serves a method. export: None (vLLM needs no file of ours), "model" (the export
    replaces the target as the served model: MTP) or "draft" (the export is the drafter)."""
    export: str | None = None
    tree: bool = False   # vLLM drafts a tree of up to num_speculative_tokens nodes, not a chain
    hook: bool = False   # our proposer also runs inside vLLM (backends/vllm_hook.py: token ids only)
    native: bool = True  # vLLM has an implementation of its own (False: ours runs, through the hook only)


def names() -> list[str]:
    return list(METHODS)


def module(name: str):
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    return importlib.import_module(METHODS[name])


def is_learned(name: str) -> bool:
    return hasattr(module(name), "setup")


def is_control(name: str) -> bool:
    return getattr(module(name), "CONTROL", False)


def vllm_serving(name: str) -> VllmServing | None:
    """None: vLLM has no counterpart of this method."""
    return getattr(module(name), "VLLM", None)


def _check_fields(cls, values: dict, where: str) -> None:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown {', '.join(unknown)}; {cls.__name__} takes {', '.join(fields)}")
    missing = [n for n, f in fields.items() if n not in values
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)} ({cls.__name__})")


def variant_params(variant: dict) -> dict:
    """A config variant's method parameters (its scope keys left out)."""
    return {k: v for k, v in variant.items() if k not in VARIANT_SCOPE}


def check_params(name: str, params: dict, where: str = "params") -> None:
    """A variant's parameters against the method's PARAMS dataclass (names and required fields)."""
    if name in PEERS:
        PEERS[name].check(f"{where}: {name}", params)
        return
    _check_fields(module(name).PARAMS, params, where)


def tuning_candidates(name: str, params: dict) -> list[dict]:
    """The parameter sets a tuned variant of `params` chooses from: `params` itself first, then
    each value of the method's tuning_grid substituted for its parameter (no duplicates). A method
    without a grid (or a negative control) has `params` only."""
    m = module(name)
    grid = {} if is_control(name) or not hasattr(m, "tuning_grid") else m.tuning_grid(m.PARAMS(**params))
    out = [dict(params)]
    for key, values in grid.items():
        if key not in {f.name for f in dataclasses.fields(m.PARAMS)}:
            raise ValueError(f"{METHODS[name]}: tuning_grid names {key!r}, not a field of {m.PARAMS.__name__}")
        for value in values:
            candidate = {**params, key: value}
            if candidate not in out:
                out.append(candidate)
    return out


def check_train_settings(name: str, settings: dict, where: str = "settings") -> None:
    from ..train.loop import TrainConfig
    if not is_learned(name):
        raise ValueError(f"{where}: method {name!r} is not trained")
    sections = {"train": TrainConfig, **module(name).TRAIN_SETTINGS}
    unknown = sorted(set(settings) - set(sections))
    if unknown:
        raise ValueError(f"{where}: unknown section {', '.join(unknown)}; {name} takes {', '.join(sections)}")
    for key, cls in sections.items():
        _check_fields(cls, settings.get(key, {}), f"{where}.{key}")


def build_proposer(name: str, params: dict, target=None):
    """The method's proposer on `target`. Its modules (a drafter network) take the target's
    linear route: bf16 and fp32 CPU linears prepacked for oneDNN (core.target.pack_linears)."""
    import torch

    from ..core.target import pack_linears
    check_params(name, params, f"method {name!r}")
    proposer = module(name).build(dict(params), target)
    for part in vars(proposer).values():
        if isinstance(part, torch.nn.Module):
            pack_linears(part)
    return proposer


def train_checkpoint(name: str, hidden_path: str, target_dir: str, out_dir: str, settings: dict,
                     overlap: int, device: str = "cpu") -> dict:
    """Train a learned method's checkpoint with the shared driver (train/driver.py); returns its
    eval proxy. `overlap`: the first N training records form the train-overlap eval slice."""
    from ..train.driver import train_checkpoint as run
    check_train_settings(name, settings)
    return run(module(name), hidden_path=hidden_path, target_dir=target_dir, out_dir=out_dir,
               settings=settings, overlap=overlap, device=device)


def vllm_config(name: str, params: dict, export_dir: str | None = None) -> dict:
    """The method's parameters -> vLLM's speculative_config."""
    serving = vllm_serving(name)
    if serving is None:
        raise ValueError(f"method {name!r} has no vLLM counterpart")
    if serving.export == "draft" and export_dir is None:
        raise ValueError(f"{name}: vLLM needs the drafter's export directory (--draft-model)")
    check_params(name, params, f"method {name!r}")
    m = module(name)
    return m.vllm_config(m.PARAMS(**params), export_dir)


def export_vllm(name: str, **kwargs) -> None:
    """Write a learned method's checkpoint in the layout vLLM loads."""
    serving = vllm_serving(name)
    if serving is None or serving.export is None:
        raise ValueError(f"method {name!r} has no vLLM export")
    module(name).export_vllm(**kwargs)


def examples_unit(name: str) -> str:
    """What one training example of a learned method is: "records" or "positions"."""
    return getattr(module(name), "EXAMPLES", "records")


def checkpoint_owner(name: str) -> str:
    """The method whose checkpoints `name` loads (a peer may load another method's)."""
    return PEERS[name].owner or name if name in PEERS else name


def source_files(name: str) -> list[str]:
    """The files a method's jobs load beyond their verb's own (deps.verb_code): its module, which
    the registry imports by name, and everything it imports (deps.module_code); a peer's: its
    checkpoint owner's (its backend is the benchmark's own import)."""
    from ..deps import module_code
    if name in PEERS:
        return source_files(PEERS[name].owner) if PEERS[name].owner else []
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join([*METHODS, *PEERS])}")
    return module_code(METHODS[name])


def check_config(config: dict) -> None:
    """What config.yaml says about methods, against the registry, before any job runs: every
    variant's parameters, every checkpoint's training settings, every vLLM entry."""
    for name, spec in config["methods"].items():
        if name not in METHODS and name not in PEERS:
            raise ValueError(f"config: methods.{name}: unknown method; known: {', '.join([*METHODS, *PEERS])}")
        for variant, params in spec["variants"].items():
            check_params(name, variant_params(params), f"config: methods.{name}.variants.{variant}")
    for name, checkpoints in config.get("train", {}).get("checkpoints", {}).items():
        for ckpt, settings in checkpoints.items():
            check_train_settings(name, settings, f"config: train.checkpoints.{name}.{ckpt}")
