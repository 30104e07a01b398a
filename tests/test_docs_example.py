"""The worked example of docs/adding-a-method.md runs as documented: its module, loaded as
specdec.methods.bigram, decodes losslessly through the shared loop (seconds)."""
import re
import sys
import types
from pathlib import Path

import torch

from conftest import tiny_llama
from specdec.core.loop import decode
from specdec.core.target import TargetModel

DOC = Path(__file__).resolve().parents[1] / "docs" / "adding-a-method.md"


def documented_module():
    """The first Python block of the guide, executed as the module it says it is."""
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    mod = types.ModuleType("specdec.methods.bigram")
    mod.__package__ = "specdec.methods"
    sys.modules[mod.__name__] = mod
    try:
        exec(compile(code, f"{DOC}:bigram.py", "exec"), mod.__dict__)
    finally:
        del sys.modules[mod.__name__]
    return mod


def test_the_documented_bigram_proposer_decodes_losslessly():
    torch.set_num_threads(1)
    bigram = documented_module()
    assert bigram.NAME == "bigram" and bigram.PARAMS(**bigram.EXAMPLE["params"]).draft_len == 3
    target = TargetModel(tiny_llama())
    prompt = [5, 6, 7, 5, 6, 7, 5, 6, 9, 5, 6]
    base = decode(target, prompt, 24, set())
    proposer = bigram.build(bigram.EXAMPLE["params"])
    out = decode(target, prompt, 24, set(), proposer)
    assert out.output_ids == base.output_ids
    assert sum(out.drafted) > 0    # it drafted: the bigram counts found continuations


def test_the_documented_module_declares_every_part_the_registry_checks(tmp_path):
    """Saved as methods/bigram.py, the guide's module passes the registry's contract check."""
    from specdec.methods import _discover
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    (tmp_path / "bigram.py").write_text(code)
    assert _discover(tmp_path, "pkg") == {"bigram": "pkg.bigram"}
