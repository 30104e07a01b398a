"""Medusa-1 and MTP on tiny random targets: training, tree, caches, lossless, checkpoints."""
import json
import random
from types import SimpleNamespace

import pytest
import torch

from conftest import check_against_fresh_proposer, distillation_set, tiny_llama, tiny_qwen2
from specdec.core.loop import decode
from specdec.core.target import TargetModel
from specdec.core.tree import root_paths
from specdec.methods import build_proposer, medusa, mtp, train_checkpoint
from specdec.train.checkpoint import CheckpointMismatch
from specdec.train.hidden import HiddenStates

EOS = {2}
FAST = {"steps": 40, "batch_size": 8, "lr": 3e-3, "warmup_steps": 2, "save_every": 15, "log_every": 1}


def greedy(model, prompt, n):
    with torch.inference_mode():
        return decode(TargetModel(model), prompt, n, set()).output_ids


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def trained(request, tmp_path_factory):
    """A tiny target saved as a checkpoint, a distillation set of its own greedy completions,
    the hidden-state artifact, and Medusa / MTP (1 and 2 modules) checkpoints trained on it."""
    torch.set_num_threads(1)
    model = tiny_llama() if request.param == "llama" else tiny_qwen2()
    out = distillation_set(model, tmp_path_factory.mktemp(request.param), [1, model.config.num_hidden_layers])
    root, target_dir, hidden = out["root"], out["target_dir"], out["hidden"]
    out["medusa_log"] = train_checkpoint("medusa", str(hidden), str(target_dir), str(root / "medusa"),
                                            {"train": FAST, "medusa": {"num_heads": 3}}, overlap=4)
    train_checkpoint("medusa", str(hidden), str(target_dir), str(root / "medusa_dv"),
                            {"train": FAST, "medusa": {"num_heads": 3, "draft_vocab_size": 24}}, overlap=4)
    for k in (1, 2):
        train_checkpoint("mtp", str(hidden), str(target_dir), str(root / f"mtp{k}"),
                      {"train": {**FAST, "steps": 100, "lr": 1e-2}, "mtp": {"num_modules": k}}, overlap=4)
    return out


def _log(ckpt):
    return json.loads((ckpt / "config.json").read_text())["train_log"]


def test_hidden_state_artifact_matches_the_target(trained):
    hs = HiddenStates(str(trained["hidden"]))
    L = trained["model"].config.num_hidden_layers
    seq = hs.split("train", [L])[3]
    r = trained["records"][3]
    assert seq.ids.tolist() == r["prompt_ids"] + r["completion_ids"] and seq.prompt_len == len(r["prompt_ids"])
    with torch.inference_mode():
        ref = trained["model"](seq.ids[None], output_hidden_states=True).hidden_states[L][0]
        normed = trained["model"].model.norm(seq.taps[L])   # the tap is before the final norm
    assert torch.allclose(normed, ref, atol=1e-5)
    with pytest.raises(ValueError, match="taps \\[2\\] were not computed"):
        hs.split("train", [2])
    with pytest.raises(ValueError, match="no soft labels .*train.hidden.soft_topk"):
        hs.split("train", [L], soft=True)


@pytest.mark.parametrize("ckpt", ["medusa", "mtp1", "mtp2"])
def test_training_lowers_the_loss(trained, ckpt):
    log = _log(trained["root"] / ckpt)
    first, last = sum(r["loss"] for r in log[:5]) / 5, sum(r["loss"] for r in log[-5:]) / 5
    assert last < 0.9 * first, (first, last)  # deterministic: seeded init and data order


def test_choose_tree_is_best_first_and_ancestor_closed():
    acc = [[0.6, 0.2, 0.1], [0.5, 0.3, 0.1], [0.4, 0.2, 0.1]]
    paths, expected = medusa.choose_tree(acc, draft_len=3, tree_topk=3, max_tree_nodes=8)
    assert len(paths) == 8 and len(set(paths)) == 8
    score = {}
    for p in paths:
        assert len(p) == 1 or p[:-1] in score  # parents are chosen first
        s = 1.0
        for d, r in enumerate(p):
            s *= acc[d][r]
        score[p] = s
    assert abs(expected - sum(score.values())) < 1e-9
    # nothing left out scores above anything chosen
    every = [(a,) for a in range(3)] + [(a, b) for a in range(3) for b in range(3)] + \
            [(a, b, c) for a in range(3) for b in range(3) for c in range(3)]
    left = [p for p in every if p not in score]
    best_left = max(torch.tensor([acc[d][r] for d, r in enumerate(p)]).prod().item() for p in left)
    assert best_left <= min(score.values()) + 1e-9
    assert medusa.choose_tree(acc, draft_len=1, tree_topk=2, max_tree_nodes=8)[0] == [(0,), (1,)]


def test_medusa_tree_forward_matches_per_path_forwards(trained):
    """The Medusa draft tree, verified in one target forward (tree mask + positions), gives each
    node the logits of a plain forward over prompt + that node's path."""
    model = trained["model"]
    target = TargetModel(model)
    prop = build_proposer("medusa", {"checkpoint": str(trained["root"] / "medusa"), "draft_len": 3,
                                     "tree_topk": 3, "max_tree_nodes": 10}, target)
    assert len(prop.parents) == 10 and not all(p == i - 1 for i, p in enumerate(prop.parents))
    prompt = trained["records"][5]["prompt_ids"]
    with torch.inference_mode():
        logits, hidden = target.prefill(prompt, prop.tap_layers)
        prop.start(prompt, hidden)
        pending = int(logits[-1].argmax())
        draft = prop.propose(prompt + [pending])
        parents = [-1] + [p + 1 for p in draft.parents]
        nodes = [pending] + draft.tokens
        tree_logits, _ = target.forward(nodes, parents)
        for path in root_paths(parents):
            ref = model(torch.tensor([prompt + [nodes[i] for i in path]])).logits[0, len(prompt):]
            assert torch.allclose(tree_logits[path], ref, atol=1e-5), path


@pytest.mark.parametrize("method,params", [
    ("medusa", {"checkpoint": "medusa", "draft_len": 3, "tree_topk": 4, "max_tree_nodes": 12}),
    ("medusa", {"checkpoint": "medusa", "draft_len": 2, "tree_topk": 1, "max_tree_nodes": 2}),
    ("medusa", {"checkpoint": "medusa_dv", "draft_len": 3, "tree_topk": 3, "max_tree_nodes": 8}),
    ("mtp", {"checkpoint": "mtp1"}),
    ("mtp", {"checkpoint": "mtp2"}),
    ("mtp", {"checkpoint": "mtp2", "num_speculative_steps": 1}),
])
def test_lossless_fp32(trained, method, params):
    model = trained["model"]
    target = TargetModel(model)
    prop = build_proposer(method, {**params, "checkpoint": str(trained["root"] / params["checkpoint"])}, target)
    rng = random.Random(3)
    prompts = [r["prompt_ids"] for r in trained["records"][:6]] + \
              [[rng.randrange(3, 64) for _ in range(9)] for _ in range(4)]
    accepted = 0
    for prompt in prompts:
        base = greedy(model, prompt, 30)
        with torch.inference_mode():
            r = decode(target, prompt, 30, set(), prop)
        assert r.output_ids == base
        accepted += sum(r.accepted)
    assert accepted > 0  # trained on these completions: some drafts must land


def test_mtp_starts_from_the_previous_state_at_residual_scale(trained, tmp_path):
    """input_init residual: input_proj = [s I | 0], so a module first reads s * hidden_norm(g),
    whatever the next token (s: g^0's median RMS over the first training sequences); random:
    nn.Linear's init, which mixes in the token."""
    model = trained["model"]
    H = model.config.hidden_size
    torch.manual_seed(0)
    prev, emb = 5 * torch.randn(3, H), torch.randn(3, H)
    for rms in (2.5, None):
        module = mtp.MTP.for_target(model, 2)
        module.init_from_target(model, rms)
        for layer in module.layers:
            with torch.no_grad():
                x = layer.input_proj(torch.cat([layer.hidden_layernorm(prev), layer.token_layernorm(emb)], -1))
                read = 2.5 * prev / prev.pow(2).mean(-1, keepdim=True).add(model.config.rms_norm_eps).sqrt()
            assert torch.allclose(x, read, atol=1e-4) == (rms is not None)
            assert torch.equal(layer.block.mlp.up_proj.weight, model.model.layers[-1].mlp.up_proj.weight)
    seqs = [SimpleNamespace(taps={7: torch.full((4, H), 3.0)}), SimpleNamespace(taps={7: torch.full((2, H), -6.0)})]
    assert mtp.state_rms(seqs, 7) == 3.0 and mtp.state_rms(seqs[1:], 7) == 6.0
    with pytest.raises(ValueError, match="mtp.input_init: 'eye' is not one of residual, random"):
        train_checkpoint("mtp", str(trained["hidden"]), str(trained["target_dir"]), str(tmp_path / "bad"),
                         {"train": FAST, "mtp": {"input_init": "eye"}}, overlap=4)


@pytest.mark.parametrize("ckpt", ["mtp1", "mtp2"])
def test_mtp_caches_match_a_from_scratch_run_after_partial_acceptance(trained, ckpt):
    """After every verification step (some drafts accepted, some not), each module's KV cache
    and draft equal those of a fresh proposer that processes the verified sequence in one go."""
    def compare(prop, fresh, ids, draft, fresh_draft):
        assert fresh_draft.tokens == draft.tokens
        for k in range(prop.steps):
            assert prop.committed[k] == fresh.committed[k] == len(ids) - 1 - k
            a, b = prop.caches[k].layers[0], fresh.caches[k].layers[0]
            assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)

    checked, outcomes = check_against_fresh_proposer(
        trained["model"], "mtp", {"checkpoint": str(trained["root"] / ckpt)},
        trained["records"][:4] + [{"prompt_ids": [5, 9, 13, 4, 22]}], compare)
    assert checked > 10
    assert 0 in outcomes and max(outcomes) >= 1  # both rejection and (partial) acceptance happened


def test_draft_vocabulary_is_the_most_frequent_tokens(trained):
    from specdec.train.vocab import coverage, frequent_tokens, target_to_draft
    seqs = HiddenStates(str(trained["hidden"])).split("train", [1])
    counts = torch.bincount(torch.cat([s.labels[s.labels >= 0] for s in seqs]), minlength=64)
    vocab = frequent_tokens(seqs, 24, 64)
    assert len(vocab) == 24 and vocab.tolist() == sorted(vocab.tolist())
    assert counts[vocab].min() >= counts[[t for t in range(64) if t not in vocab.tolist()]].max()
    t2d = target_to_draft(vocab, 64)
    assert all(t2d[v] == i for i, v in enumerate(vocab.tolist())) and (t2d >= 0).sum() == 24
    assert 0 < coverage(seqs, vocab, 64) <= 1 and coverage(seqs, torch.arange(64), 64) == 1
    # the checkpoint keeps the vocabulary; its drafts are target ids from it
    meta = json.loads((trained["root"] / "medusa_dv" / "config.json").read_text())
    assert meta["draft_vocab"]["size"] == 24
    target = TargetModel(trained["model"])
    prop = build_proposer("medusa", {"checkpoint": str(trained["root"] / "medusa_dv")}, target)
    assert torch.equal(prop.vocab, vocab)
    prompt = trained["records"][2]["prompt_ids"]
    with torch.inference_mode():
        logits, hidden = target.prefill(prompt, prop.tap_layers)
        prop.start(prompt, hidden)
        draft = prop.propose(prompt + [int(logits[-1].argmax())])
    assert set(draft.tokens) <= set(vocab.tolist())
    with pytest.raises(ValueError, match="draft vocabulary size 65"):
        frequent_tokens(seqs, 65, 64)


def test_medusa_calibrates_on_a_seeded_sample_of_train_positions(trained, monkeypatch):
    root, model = trained["root"], trained["model"]
    L = model.config.num_hidden_layers
    x, y, _ = medusa.head_examples(HiddenStates(str(trained["hidden"])).split("train", [L]), L, model.model.norm, 3)
    keep = medusa.calibration_sample(len(x), 20)
    assert len(x) > 20 and keep.unique().numel() == 20 and torch.equal(keep, medusa.calibration_sample(len(x), 20))
    assert torch.equal(medusa.calibration_sample(len(x), None), torch.arange(len(x)))
    seen, real = [], medusa.rank_accuracy

    def spy(heads, xs, ys, max_rank):
        seen.append(xs.clone())
        return real(heads, xs, ys, max_rank)

    monkeypatch.setattr(medusa, "rank_accuracy", spy)
    train_checkpoint("medusa", str(trained["hidden"]), str(trained["target_dir"]), str(root / "medusa_cal"),
                     {"train": FAST, "medusa": {"num_heads": 3, "calibration_positions": 20}}, overlap=4)
    # the eval splits whole, the train split on the sample's positions
    assert len(seen) == 3 and sum(torch.equal(xs, x[keep]) for xs in seen) == 1
    assert sorted(len(xs) for xs in seen)[-1] < len(x)


@pytest.mark.parametrize("method,ckpt", [("medusa", "medusa"), ("medusa", "medusa_dv"), ("mtp", "mtp2")])
def test_checkpoint_round_trip_and_mismatch(trained, method, ckpt, tmp_path):
    model = trained["model"]
    module = (medusa if method == "medusa" else mtp).NAME
    from specdec.train.checkpoint import load_proposer, save_proposer
    meta, state = load_proposer(str(trained["root"] / ckpt), module, model.config)
    save_proposer(str(tmp_path / "copy"), module, meta["config"], state, model.config,
                  extra={k: v for k, v in meta.items() if k not in ("method", "config", "target")})
    meta2, state2 = load_proposer(str(tmp_path / "copy"), module, model.config)
    assert meta2 == meta and state2.keys() == state.keys()
    assert all(torch.equal(state[k], state2[k]) for k in state)
    # the reloaded checkpoint drafts exactly as the original
    target = TargetModel(model)
    a = build_proposer(method, {"checkpoint": str(trained["root"] / ckpt)}, target)
    b = build_proposer(method, {"checkpoint": str(tmp_path / "copy")}, target)
    prompt = trained["records"][0]["prompt_ids"]
    with torch.inference_mode():
        logits, hidden = target.prefill(prompt, a.tap_layers)
        ids = prompt + [int(logits[-1].argmax())]
        a.start(prompt, hidden)
        b.start(prompt, hidden)
        assert a.propose(ids).tokens == b.propose(ids).tokens
    # a target of another shape is refused, naming the field and both values
    other = tiny_llama()
    other.config.hidden_size = 48
    with pytest.raises(CheckpointMismatch, match="target.hidden_size is 32 but the target model's hidden_size is 48"):
        load_proposer(str(trained["root"] / ckpt), module, other.config)
    other.config.hidden_size, other.config.vocab_size = 32, 80
    with pytest.raises(CheckpointMismatch, match="vocab_size is 64 but .* vocab_size is 80"):
        load_proposer(str(trained["root"] / ckpt), module, other.config)
    with pytest.raises(CheckpointMismatch, match="is for method"):
        load_proposer(str(trained["root"] / ckpt), "mtp" if method == "medusa" else "medusa", model.config)


@pytest.mark.parametrize("ckpt", ["mtp1", "mtp2"])
def test_mtp_vllm_export_layout(trained, ckpt, tmp_path):
    """The MiMo layout: the exported target (as Qwen2) reproduces the original's logits, and
    model.mtp_layers.k.* hold the trained module weights under vLLM's names."""
    from safetensors.torch import load_file
    from transformers import Qwen2ForCausalLM
    model = trained["model"]
    out = tmp_path / "export"
    mtp.export_vllm(str(trained["root"] / ckpt), str(trained["target_dir"]), str(out))
    cfg = json.loads((out / "config.json").read_text())
    K = 1 if ckpt == "mtp1" else 2
    assert cfg["model_type"] == "qwen2" and cfg["architectures"] == ["MiMoForCausalLM"]
    assert cfg["num_nextn_predict_layers"] == K and cfg["tie_word_embeddings"] is False
    w = load_file(out / "model.safetensors")
    assert torch.equal(w["lm_head.weight"], model.lm_head.weight)
    for k in range(K):
        for name in ("token_layernorm", "hidden_layernorm", "input_proj", "final_layernorm",
                     "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.o_proj",
                     "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            assert f"model.mtp_layers.{k}.{name}.weight" in w, name
        for proj in ("q_proj", "k_proj", "v_proj"):
            assert f"model.mtp_layers.{k}.self_attn.{proj}.bias" in w
    assert not [n for n in w if ".block." in n]
    state = mtp.load_module(str(trained["root"] / ckpt), model).state_dict()
    assert torch.equal(w["model.mtp_layers.0.input_proj.weight"], state["layers.0.input_proj.weight"])
    assert torch.equal(w["model.mtp_layers.0.self_attn.k_proj.weight"], state["layers.0.block.self_attn.k_proj.weight"])
    # the exported target, loaded as the Qwen2 it claims to be, gives the original's logits
    exported = Qwen2ForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([trained["records"][1]["prompt_ids"] + trained["records"][1]["completion_ids"]])
    with torch.inference_mode():
        assert torch.allclose(exported(ids).logits, model(ids).logits, atol=1e-5)
    assert (out / "manifest.json").exists() and not (tmp_path / "export.partial").exists()


@pytest.mark.parametrize("ckpt", ["medusa", "medusa_dv"])
def test_medusa_vllm_export_drafts_our_top1(trained, ckpt, tmp_path):
    """vLLM's Medusa layout: `blocks.k.layers.0` through vLLM's own ResidualBlock, then
    `lm_heads.k` over the full vocabulary (a reduced draft vocabulary's other rows zero), gives
    each head's top-1 token as ours does, wherever our best logit is positive."""
    from safetensors.torch import load_file
    from vllm.model_executor.models.medusa import ResidualBlock

    model = trained["model"]
    out = tmp_path / "export"
    medusa.export_vllm(str(trained["root"] / ckpt), str(trained["target_dir"]), str(out))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["MedusaModel"] and cfg["num_heads"] == 3 and cfg["num_hidden_layers"] == 1
    assert cfg["vocab_size"] == cfg["truncated_vocab_size"] == model.config.vocab_size and cfg["medusa_fc_bias"]
    w = load_file(out / "model.safetensors")
    heads = medusa.load_module(str(trained["root"] / ckpt), model).eval()
    r = trained["records"][2]
    with torch.inference_mode():
        h = model(torch.tensor([r["prompt_ids"] + r["completion_ids"]]), output_hidden_states=True).hidden_states[-1][0]
        ours = heads(h)                                             # (K, T, draft vocab)
        compared = 0
        for k in range(3):
            block = ResidualBlock(SimpleNamespace(medusa_fc_bias=True), model.config.hidden_size, 1)
            block.load_state_dict({"layers.0.weight": w[f"blocks.{k}.layers.0.weight"],
                                   "layers.0.bias": w[f"blocks.{k}.layers.0.bias"]})
            theirs = (block(h) @ w[f"lm_heads.{k}.weight"].T).argmax(-1)   # (T,) target ids
            top = ours[k].argmax(-1)
            top = top if heads.draft_vocab is None else heads.draft_vocab[top]
            positive = ours[k].max(-1).values > 0
            assert torch.equal(theirs[positive], top[positive])
            compared += int(positive.sum())
    assert compared > 0
    spec = medusa.vllm_config(medusa.MedusaConfig(checkpoint="x", draft_len=3), str(out))
    assert spec == {"method": "medusa", "model": str(out), "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match="draft_len must equal the export's 3 heads"):
        medusa.vllm_config(medusa.MedusaConfig(checkpoint="x", draft_len=2), str(out))
