"""specdec.deps: each job's code inputs from the import graph (the smoke DAG's check against the
files its jobs really load is in test_workflow.py)."""
from pathlib import Path

import pytest

from specdec import deps, methods


def rel(files):
    return {f.split("/src/specdec/", 1)[1] for f in files}


def test_the_vllm_job_depends_on_what_it_imports():
    """The hand-kept list this replaced left out core/sampling.py (a top-level import of
    vllm_bench) and core/loop.py (the Draft our proposers return inside vLLM)."""
    code = rel(deps.verb_code("bench-vllm"))
    assert {"backends/vllm_bench.py", "backends/vllm_hook.py", "core/sampling.py", "core/metrics.py",
            "cli.py", "__main__.py", "methods/__init__.py", "__init__.py"} <= code
    assert "core/loop.py" in rel(methods.source_files("ngram")) | code
    assert not {f for f in code if f.startswith(("train/", "report/"))}


def test_lazy_imports_count_in_the_job_module_only():
    """The registry imports the trainer inside train_checkpoint: a training job loads it, a
    benchmark (which only builds proposers through the registry) does not."""
    assert "train/driver.py" in rel(deps.verb_code("train"))
    bench = rel(deps.verb_code("bench-torch"))
    assert "train/driver.py" not in bench
    # torch_bench's own imports, top level and lazy, and what those load
    assert {"backends/torch_bench.py", "backends/hf_generate.py", "core/target.py", "core/tree.py",
            "models.py", "host.py"} <= bench


def test_data_and_report_jobs_do_not_depend_on_the_engines():
    for verb in ("hidden-states", "wiki-set", "report", "drift"):
        assert not {f for f in rel(deps.verb_code(verb)) if f.startswith("backends/")}, verb
    assert {"train/hidden.py", "core/target.py"} <= rel(deps.verb_code("hidden-states"))
    assert {"report/tables.py", "report/plots.py", "report/costcheck.py"} <= rel(deps.verb_code("report"))


def test_a_method_module_brings_what_it_imports():
    assert {"methods/pard.py", "methods/draft_lm.py"} <= rel(methods.source_files("pard"))
    assert "methods/draft_lm.py" not in rel(methods.source_files("eagle3"))
    assert rel(methods.source_files("hf_assisted")) == rel(methods.source_files("draft_model"))
    assert methods.source_files("hf_generate") == []


def test_an_unknown_verb_names_the_cli():
    with pytest.raises(ValueError, match=r"cli\.py: no cmd_no_such_verb"):
        deps.verb_code("no-such-verb")
    with pytest.raises(ValueError, match="not a project module"):
        deps.closure("json")


def test_relative_imports_resolve_against_the_package():
    # methods/__init__.py: `from ..core.target import pack_linears` inside build_proposer
    assert "specdec.core.target" in deps.imports(deps.module_path("specdec.methods"), in_functions=True)
    assert "specdec.core.target" not in deps.imports(deps.module_path("specdec.methods"))
    assert deps.module_name(deps.module_path("specdec.core")) == "specdec.core"


def test_inputs_are_named_relative_to_the_working_directory(tmp_path):
    """Rules list code inside the working directory by relative name (a moved checkout keeps its
    outputs up to date), and anything outside it by absolute name."""
    code = deps.verb_code("report")
    src = deps.ROOT.parent
    assert deps.as_inputs(code, root=src.parent) == [str(Path(p).relative_to(src.parent)) for p in code]
    assert deps.as_inputs(code, root=tmp_path) == code
    assert all(not Path(p).is_absolute() for p in deps.as_inputs(code, root=src))
