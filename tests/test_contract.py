"""The contract every registered method meets, checked the same way for each (a new method gets
these tests by registering): its declarations, lossless greedy decoding in fp32, sampling that
is lossless in distribution, a reused proposer equal to a fresh one, and for learned methods a
checkpoint that reproduces its eval proxy, resumes, and refuses another target. Each method's
EXAMPLE is the variant under test (and its vllm_params variant where that differs)."""
import ast
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import sampling_check
import specdec.core.loop as core_loop
from conftest import distillation_set, tiny_llama
from specdec import methods
from specdec.core.loop import decode
from specdec.core.target import TargetModel
from specdec.train import loop
from specdec.train.checkpoint import CheckpointMismatch, checkpoint_record
from specdec.train.driver import reevaluate
from specdec.train.hidden import HiddenStates

LEARNED = [m for m in methods.names() if methods.is_learned(m)]
NEW_TOKENS = 20


def free_token_zero(model):
    """Token 0's LM-head row is zero, so its logit (0) is never the argmax: the target never
    emits it, prompts never hold it, and it is free as a mask token (PARD's EXAMPLE uses it)."""
    with torch.no_grad():
        model.lm_head.weight[0] = 0
    return model


def random_final_norm(model, seed=0):
    """The final RMSNorm's weights drawn from U(-2, 3), as a trained target's are (SmolLM2's run
    from -2.1 to 3.3): with weights of 1 the norm barely changes a state's direction, so a feature
    read on the wrong side of it would go unnoticed."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = model.model.norm.weight
        w.copy_(torch.rand(w.shape, generator=gen) * 5 - 2)
    assert (w < 0).any()
    return model


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny target (final-norm weights random, some negative), its distillation set and hidden states,
    and every learned method's EXAMPLE checkpoint trained on them (fp32)."""
    torch.set_num_threads(1)
    model = random_final_norm(free_token_zero(tiny_llama()))
    taps = sorted({t for m in LEARNED
                   for t in methods.module(m).hidden_taps(model.config, methods.module(m).EXAMPLE["train"])})
    out = distillation_set(model, tmp_path_factory.mktemp("contract"), taps or [model.config.num_hidden_layers],
                           soft_topk=4)
    assert all(0 not in r["prompt_ids"] + r["completion_ids"] for r in out["records"])
    out["checkpoints"] = {}
    for m in LEARNED:
        ckpt = out["root"] / m
        train_checkpoint(m, out, ckpt)
        out["checkpoints"][m] = ckpt
    return out


def train_checkpoint(method, world, out_dir, settings=None):
    return methods.train_checkpoint(method, str(world["hidden"]), str(world["target_dir"]), str(out_dir),
                                    settings or methods.module(method).EXAMPLE["train"], overlap=4)


def example_params(method, world, key="params") -> dict:
    example = methods.module(method).EXAMPLE
    params = dict(example.get(key, example["params"]))
    if methods.is_learned(method):
        params["checkpoint"] = str(world["checkpoints"][method])
    return params


def run(target, prompt, proposer=None):
    with torch.inference_mode():
        return decode(target, prompt, NEW_TOKENS, set(), proposer)


def make_proposer(method, world):
    """(target, proposer): a proposer decodes through the target it was built on."""
    target = TargetModel(world["model"])
    return target, methods.build_proposer(method, example_params(method, world), target)


@pytest.mark.parametrize("method", LEARNED)
def test_decoding_features_equal_the_training_features(method, world):
    """One feature space: the hidden states a proposer is handed while decoding (start() and every
    observe()) equal the training cache's taps for the same tokens, tap by tap."""
    m = methods.module(method)
    trained_on = m.hidden_taps(world["model"].config, m.EXAMPLE["train"])
    target, prop = make_proposer(method, world)
    assert sorted(prop.tap_layers) == sorted(trained_on)
    if not trained_on:
        return   # reads no target state (a standalone draft LM): nothing to compare
    cached = HiddenStates(str(world["hidden"])).split("heldout", trained_on)
    received = []
    start, observe = prop.start, prop.observe
    prop.start = lambda ids, hidden, sampler=None: (received.append(hidden), start(ids, hidden, sampler))[1]
    prop.observe = lambda step: (received.append(step.hidden), observe(step))[1]
    compared = 0
    for rec, seq in zip(world["records"][:4], cached):
        received.clear()
        out = run(target, rec["prompt_ids"], prop).output_ids
        assert seq.ids.tolist()[:len(rec["prompt_ids"]) + len(out)] == rec["prompt_ids"] + out  # same tokens
        for layer in trained_on:
            got = torch.cat([h[layer] for h in received])   # positions 0 .. len(ids) - 2, in order
            assert torch.allclose(got, seq.taps[layer][:len(got)], atol=1e-4, rtol=1e-4), (method, layer)
            compared += len(got)
    assert compared > 0


def test_post_norm_features_are_the_cache_before_the_feature_fix(world):
    """train.features post_norm (the ablation's rows before the fix): a run reads tap num_layers as
    transformers' last output_hidden_states entry, after the final norm, as the cache stored it
    then; the other taps, and every tap under pre_norm, are the cache's own."""
    from specdec.train.driver import _prepare
    model, last = world["model"], world["model"].config.num_hidden_layers
    example = methods.module("mtp").EXAMPLE["train"]
    taps = methods.module("mtp").hidden_taps(model.config, example)
    assert last in taps
    cached = HiddenStates(str(world["hidden"])).split("heldout", taps)
    for features in ("pre_norm", "post_norm"):
        settings = {**example, "train": {**example["train"], "features": features}}
        _, _, _, data = _prepare(methods.module("mtp"), str(world["hidden"]), str(world["target_dir"]), settings, 4)
        for seq, raw in zip(data.heldout, cached):
            with torch.inference_mode():
                post = model(seq.ids[None].long(), output_hidden_states=True).hidden_states[last][0]
            want = post if features == "post_norm" else raw.taps[last]
            assert torch.allclose(seq.taps[last], want, atol=1e-4, rtol=1e-4), features
            assert not torch.allclose(raw.taps[last], post, atol=1e-2)   # the two spaces differ here
    with pytest.raises(ValueError, match="train.features"):
        _prepare(methods.module("mtp"), str(world["hidden"]), str(world["target_dir"]),
                 {**example, "train": {**example["train"], "features": "postnorm"}}, 4)


@pytest.mark.parametrize("method", LEARNED)
def test_soft_labels_reach_the_loss_at_the_hard_labels_positions(method, world, tmp_path):
    """train.soft_labels: with the target's top-1 as the soft label, training equals hard-label
    training weight for weight (each method's soft labels sit where its hard labels do); with its
    top-4 the weights differ (the soft path is the one that ran)."""
    from specdec.train.hidden import write_hidden_states
    taps = HiddenStates(str(world["hidden"])).meta["taps"]
    top1 = tmp_path / "top1.safetensors"
    write_hidden_states(str(world["target_dir"]), {s: str(world["root"] / f"{s}.jsonl") for s in ("train", "heldout")},
                        taps, str(top1), dtype="float32", soft_topk=1)
    example = methods.module(method).EXAMPLE["train"]
    soft = {**example, "train": {**example["train"], "soft_labels": True}}
    train_checkpoint(method, {**world, "hidden": top1}, tmp_path / "top1", soft)
    train_checkpoint(method, world, tmp_path / "top4", soft)
    hard = load_file(_weights_file(world["checkpoints"][method]))
    for name, w in load_file(_weights_file(tmp_path / "top1")).items():
        assert torch.allclose(w.float(), hard[name].float(), atol=1e-5), (method, name)
    top4 = load_file(_weights_file(tmp_path / "top4"))
    assert any(not torch.allclose(w.float(), hard[name].float(), atol=1e-5) for name, w in top4.items()
               if w.is_floating_point())


def _weights_file(ckpt):
    return next(p for p in sorted(ckpt.iterdir()) if p.suffix == ".safetensors")


@pytest.mark.parametrize("method", methods.names())
def test_declarations(method):
    m = methods.module(method)
    assert m.NAME == method
    assert "checkpoint" not in m.EXAMPLE["params"]
    methods.check_params(method, {**m.EXAMPLE["params"], **({"checkpoint": "x"} if methods.is_learned(method) else {})})
    if methods.is_learned(method):
        for name in ("TRAIN_SETTINGS", "hidden_taps", "setup", "load_module"):
            assert hasattr(m, name), f"learned method {method} must define {name}"
        methods.check_train_settings(method, m.EXAMPLE["train"])
    serving = methods.vllm_serving(method)
    if serving is not None:
        assert callable(m.vllm_config)
        if serving.export:
            assert callable(m.export_vllm)
    assert m.__file__ in methods.source_files(method)
    with pytest.raises(ValueError, match="unknown"):
        methods.check_params(method, {**m.EXAMPLE["params"], "no_such_parameter": 1})


@pytest.mark.parametrize("method", methods.names())
def test_lossless_in_fp32(method, world):
    """Greedy outputs equal the baseline's token for token, and the method did draft."""
    target, proposer = make_proposer(method, world)
    drafted = 0
    for rec in world["records"][:6]:
        ours = run(target, rec["prompt_ids"], proposer)
        assert ours.output_ids == run(TargetModel(world["model"]), rec["prompt_ids"]).output_ids, rec["id"]
        drafted += sum(ours.drafted)
    assert drafted > 0, f"{method} never drafted"


def run_tokens(world, prompt, build, n):
    """Greedy decode of n tokens with the proposer build(target) makes."""
    target = TargetModel(world["model"])
    with torch.inference_mode():
        return decode(target, prompt, n, set(), build(target))


# a negative control's drafts are never accepted: nothing to test against the distribution
SAMPLED_CASES = [(m, key) for m in methods.names() if not methods.is_control(m) for key in ("params", "vllm_params")
                 if key == "params" or methods.module(m).EXAMPLE.get(key, methods.module(m).EXAMPLE["params"])
                 != methods.module(m).EXAMPLE["params"]]


def sampled_distribution_test(method, key, world):
    """(p-value, degrees of freedom, accepted, drafted) of the chi-square test of the method's
    first sampled tokens against the target's exact joint distribution (tests/sampling_check.py)."""
    def build(target):
        return methods.build_proposer(method, example_params(method, world, key), target)

    # a prompt on which the (barely trained) drafter's greedy drafts are accepted in the first
    # tokens; each repeats its opening after the target's continuation, for prompt lookup
    prompts = [r["prompt_ids"] + r["completion_ids"][:4] + r["prompt_ids"] for r in world["records"]]
    prompt = next(p for p in prompts if sum(run_tokens(world, p, build, sampling_check.TOKENS).accepted))
    joint = sampling_check.exact_joint(world["model"], prompt, sampling_check.settings())
    counts, accepted, drafted = sampling_check.sample(world["model"], prompt, build)
    return (*sampling_check.chi_square(counts, joint), accepted, drafted)


@pytest.mark.parametrize("method, key", SAMPLED_CASES)
def test_sampling_is_lossless_in_distribution(method, key, world):
    """At T > 0 the first tokens follow the target's exact joint distribution, and the method's
    drafts were both accepted and rejected."""
    pvalue, df, accepted, drafted = sampled_distribution_test(method, key, world)
    assert pvalue > sampling_check.ALPHA, f"{method} ({key}): p = {pvalue:.2g} over {df} degrees of freedom"
    assert 0 < accepted < drafted, f"{method} ({key}): {accepted} of {drafted} drafts accepted"


@pytest.mark.parametrize("method, key", SAMPLED_CASES)
def test_sampling_test_catches_accepting_every_draft(method, key, world, monkeypatch):
    """Negative control: with a verifier that accepts every draft, the same test fails."""
    from test_sampling import always_accept
    monkeypatch.setattr(core_loop, "verify_sampled", always_accept)
    pvalue, df, _, _ = sampled_distribution_test(method, key, world)
    assert pvalue < sampling_check.ALPHA, f"{method} ({key}): p = {pvalue:.2g} over {df} degrees of freedom"


@pytest.mark.parametrize("method", methods.names())
def test_reused_proposer_equals_a_fresh_one(method, world):
    """start() resets everything: after decoding other prompts, a proposer drafts exactly what a
    fresh one drafts."""
    target, used = make_proposer(method, world)
    for rec in world["records"][6:9]:
        run(target, rec["prompt_ids"], used)
    for rec in world["records"][9:12]:
        a = run(target, rec["prompt_ids"], used)
        fresh_target, fresh = make_proposer(method, world)
        b = run(fresh_target, rec["prompt_ids"], fresh)
        assert (a.output_ids, a.drafted, a.accepted, a.depth) == (b.output_ids, b.drafted, b.accepted, b.depth)


@pytest.mark.parametrize("method", LEARNED)
def test_checkpoint_reproduces_its_eval_proxy(method, world):
    """Saved, loaded by the method's own loader and evaluated again: the eval proxy recorded at
    training time comes back exactly."""
    ckpt = world["checkpoints"][method]
    again = reevaluate(methods.module(method), str(ckpt), hidden_path=str(world["hidden"]),
                       target_dir=str(world["target_dir"]), settings=methods.module(method).EXAMPLE["train"],
                       overlap=4)
    recorded = checkpoint_record(str(ckpt))[1]["eval_proxy"]
    assert again == recorded


@pytest.mark.parametrize("method", LEARNED)
def test_interrupted_training_resumes_to_the_same_weights(method, world, tmp_path, monkeypatch):
    settings = methods.module(method).EXAMPLE["train"]
    steps, save_every = settings["train"]["steps"], settings["train"]["save_every"]
    assert save_every < steps
    real_train = loop.train

    def interrupted(module, loss_fn, *a, **kw):
        def failing(m, step):
            if step == save_every + 1:
                raise KeyboardInterrupt
            return loss_fn(m, step)
        return real_train(module, failing, *a, **kw)

    monkeypatch.setattr(loop, "train", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_checkpoint(method, world, tmp_path)
    assert (tmp_path / "resume.pt").is_file() and not (tmp_path / "manifest.json").exists()
    seen = []

    def counting(module, loss_fn, *a, **kw):
        return real_train(module, lambda m, step: (seen.append(step), loss_fn(m, step))[1], *a, **kw)

    # resumed with another log and eval schedule: how often the loop logs and evaluates is not
    # what it trains, so the run continues (and an evaluation mid-run leaves the weights alone)
    rescheduled = json.loads(json.dumps(settings))
    rescheduled["train"].update(log_every=1, eval_every=steps - 1)
    monkeypatch.setattr(loop, "train", counting)
    train_checkpoint(method, world, tmp_path, rescheduled)
    assert seen[0] == save_every and seen[-1] == steps - 1
    assert not (tmp_path / "resume.pt").exists()
    # the evaluation mid-run is in the saved training log, with the held-out proxy
    evals = [r for r in checkpoint_record(str(tmp_path))[1]["train_log"] if "eval" in r]
    assert [r["step"] for r in evals] == [steps - 1] and evals[0]["eval"].keys() >= {"overlap", "heldout"}
    a = load_file(tmp_path / "model.safetensors")
    b = load_file(world["checkpoints"][method] / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("method", LEARNED)
def test_refuses_a_checkpoint_made_for_another_target(method, world):
    from transformers import LlamaConfig, LlamaForCausalLM
    other = LlamaForCausalLM(LlamaConfig(vocab_size=80, hidden_size=48, intermediate_size=64, num_hidden_layers=3,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    with pytest.raises(CheckpointMismatch):
        methods.build_proposer(method, example_params(method, world), TargetModel(other))


@pytest.mark.parametrize("method", [m for m in methods.names() if methods.vllm_serving(m)])
def test_vllm_mapping(method, world, tmp_path):
    """vLLM's speculative_config from the EXAMPLE variant, and the export where one is needed."""
    serving = methods.vllm_serving(method)
    export = None
    if serving.export:
        export = tmp_path / "export"
        methods.export_vllm(method, ckpt_dir=str(world["checkpoints"][method]),
                            target_dir=str(world["target_dir"]), out_dir=str(export))
        assert (export / "config.json").is_file() and (export / "manifest.json").is_file()
    params = example_params(method, world, "vllm_params")
    spec = methods.vllm_config(method, params, None if export is None else str(export))
    assert spec["num_speculative_tokens"] >= 1
    assert isinstance(spec.get("method"), str) or not serving.native   # a hook-only one: the hook's length


@pytest.mark.parametrize("method", methods.names())
def test_generate_command(method, world, capsys):
    """`specdec generate` with the method on a prompt given on the command line: it streams the
    target's own greedy continuation and reports acceptance, tau and tokens/s."""
    from conftest import save_word_tokenizer
    from specdec.cli import main
    save_word_tokenizer(world["target_dir"])
    prompt = world["records"][0]["prompt_ids"]
    args = ["generate", " ".join(f"w{t}" for t in prompt), "--method", method, "--target", str(world["target_dir"]),
            "--config", "none.yaml", "--params", json.dumps(example_params(method, world)),
            "--max-new-tokens", str(NEW_TOKENS), "--dtype", "float32", "--raw"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    baseline = run(TargetModel(world["model"]), prompt).output_ids
    assert out.split() == [f"w{t}" for t in baseline if t != 2]
    assert f"[{method} " in err and "tok/s; acceptance" in err and "tau" in err


def test_generate_command_samples_with_a_seed(world, capsys):
    """`specdec generate --temperature`: a seed repeats the text, another seed changes it."""
    from conftest import save_word_tokenizer
    from specdec.cli import main
    save_word_tokenizer(world["target_dir"])
    method = "draft_model"
    prompt = " ".join(f"w{t}" for t in world["records"][0]["prompt_ids"])
    outs = []
    for seed in (3, 3, 4):
        args = ["generate", prompt, "--method", method, "--target", str(world["target_dir"]), "--config", "none.yaml",
                "--params", json.dumps(example_params(method, world)), "--max-new-tokens", str(NEW_TOKENS),
                "--dtype", "float32", "--raw", "--temperature", "1.0", "--seed", str(seed)]
        assert main(args) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] != outs[2]


@pytest.mark.parametrize("probe_s, chosen", [({"bfloat16": 1.0, "float32": 1.1}, "bfloat16"),
                                             ({"bfloat16": 1.0, "float32": 0.5}, "float32")],
                         ids=["bf16 within the margin", "fp32 faster"])
def test_auto_train_dtype_is_probed_and_recorded(world, tmp_path, monkeypatch, probe_s, chosen):
    """`dtype: auto` on a (faked) bf16-native host: the driver times the run's first steps in both
    dtypes, trains in the one it picks, and the checkpoint says which and why; evaluating it again
    with the same `auto` settings uses the recorded dtype. The probes run for real; their timings
    are replaced, so the choice does not depend on how fast this host runs a tiny model in each."""
    from specdec import host
    from specdec.train import driver
    monkeypatch.setattr(host, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    probe, probed = driver._seconds_per_step, []

    def timed(method, target, data, settings, tcfg, device):
        probe(method, target, data, settings, tcfg, device)
        probed.append(tcfg.dtype)
        return probe_s[tcfg.dtype]

    monkeypatch.setattr(driver, "_seconds_per_step", timed)
    train_loop, trained_in = loop.train, []

    def spy(module, *args, **kwargs):
        trained_in.append({p.dtype for p in module.parameters() if p.requires_grad})
        return train_loop(module, *args, **kwargs)

    monkeypatch.setattr(loop, "train", spy)
    method = "medusa"
    settings = json.loads(json.dumps(methods.module(method).EXAMPLE["train"]))
    settings["train"]["dtype"] = "auto"
    methods.train_checkpoint(method, str(world["hidden"]), str(world["target_dir"]), str(tmp_path), settings,
                             overlap=4)
    train = json.loads((tmp_path / "config.json").read_text())["train"]
    assert sorted(probed) == ["bfloat16", "float32"]
    assert train["dtype"] == chosen and train["dtype_requested"] == "auto"
    assert f"bfloat16 {probe_s['bfloat16']:.2f} s/step" in train["dtype_reason"]
    assert trained_in == [{torch.float32}] and train["master_weights"] == "float32"  # bf16: matmuls under autocast
    again = reevaluate(methods.module(method), str(tmp_path), hidden_path=str(world["hidden"]),
                       target_dir=str(world["target_dir"]), settings=settings, overlap=4)
    assert again == json.loads((tmp_path / "config.json").read_text())["eval_proxy"]


@pytest.mark.parametrize("drop, missing", [
    ("def setup", "setup (a learned method: it declares TRAIN_SETTINGS, hidden_taps, load_module)"),
    ("def build", "build"),
    ("def vllm_config", "vllm_config"),
    ("def export_vllm", "export_vllm"),
    ("EXAMPLE =", "EXAMPLE"),
])
def test_a_method_module_missing_a_part_fails_at_registry_import(tmp_path, drop, missing):
    """The registry checks each method module's parts when it discovers it: a learned method that
    forgets setup is an error naming the module and the part, not a training-free method."""
    source = Path(methods.module("eagle3").__file__).read_text()
    tree = ast.parse(source)
    kept = [n for n in tree.body if not ast.get_source_segment(source, n).startswith(drop)]
    assert len(kept) == len(tree.body) - 1, drop
    (tmp_path / "eagle3.py").write_text(source)
    assert methods._discover(tmp_path, "pkg") == {"eagle3": "pkg.eagle3"}
    (tmp_path / "eagle3.py").write_text("\n\n".join(ast.get_source_segment(source, n) for n in kept))
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'eagle3.py'}: method module lacks {missing}")):
        methods._discover(tmp_path, "pkg")
