"""EAGLE-3 on tiny random targets: the TTT unroll against step-by-step drafting, d2t, the
EAGLE-2 dynamic tree, drafter-cache consistency, losslessness and the vLLM export layout."""
import json
import random

import pytest
import torch
from safetensors.torch import load_file

from conftest import check_against_fresh_proposer, distillation_set, tiny_llama, tiny_qwen2
from specdec.core.loop import decode
from specdec.core.target import TargetModel, new_cache
from specdec.core.tree import tree_attention_inputs
from specdec.methods import build_proposer, eagle3, train_checkpoint
from specdec.train.hidden import HiddenStates, Sequence

FAST = {"steps": 60, "batch_size": 8, "lr": 1e-2, "warmup_steps": 2, "save_every": 25, "log_every": 1}
TAPS = [1, 2, 3]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def trained(request, tmp_path_factory):
    torch.set_num_threads(1)
    model = tiny_llama() if request.param == "llama" else tiny_qwen2()
    out = distillation_set(model, tmp_path_factory.mktemp(f"eagle3-{request.param}"), TAPS)
    for name, ttt, vocab in (("ttt3", 3, None), ("ttt2_dv", 2, 40)):
        train_checkpoint("eagle3", str(out["hidden"]), str(out["target_dir"]), str(out["root"] / name),
                                {"train": FAST, "eagle3": {"taps": TAPS, "ttt_steps": ttt, "draft_vocab_size": vocab,
                                                           "train_context": 6}}, overlap=4)
    return out


def _config(ckpt):
    return json.loads((ckpt / "config.json").read_text())


def test_default_taps_are_low_mid_high():
    assert eagle3.default_taps(30) == [2, 15, 27]
    assert eagle3.default_taps(28) == [2, 14, 25]


def test_ttt_masks_are_causal_then_diagonal():
    masks = eagle3.ttt_masks(4, 3, torch.float32)
    assert [tuple(m.shape) for m in masks] == [(1, 1, 4, 4), (1, 1, 4, 8), (1, 1, 4, 12)]
    visible = masks[2][0, 0] == 0
    assert torch.equal(visible[:, :4], torch.ones(4, 4, dtype=torch.bool).tril())
    assert torch.equal(visible[:, 4:8], torch.eye(4, dtype=torch.bool))
    assert torch.equal(visible[:, 8:], torch.eye(4, dtype=torch.bool))


def _step_by_step(drafter, model, ids, feats, j, steps):
    """What the drafter computes at inference: rows 0..j from the target's features in one causal
    forward with a cache, then `steps - 1` rows of its own states with the true tokens."""
    embed, rotary = model.model.embed_tokens, model.model.rotary_emb
    cache = new_cache(drafter.layer_config)
    mask, pos = tree_attention_inputs(list(range(-1, j)), 0, torch.float32)
    g = drafter.fc(feats[None, :j + 1])
    emb = embed(ids[None, 1:j + 2])
    o, normed = drafter(g, emb, pos, rotary(emb, pos), mask, cache)
    out = [drafter.lm_head(normed[0, -1])]
    for s in range(1, steps):
        mask, pos = tree_attention_inputs([-1], j + s, torch.float32)
        emb = embed(ids[None, j + s + 1:j + s + 2])
        o, normed = drafter(o[:, -1:], emb, pos, rotary(emb, pos), mask, cache)
        out.append(drafter.lm_head(normed[0, -1]))
    return out


@pytest.mark.parametrize("vocab_size", [None, 40])
def test_ttt_unroll_matches_step_by_step_drafting(vocab_size):
    """Every labelled row j at TTT step s has the logits the drafter produces at inference after s
    own steps from position j (masks, positions, left padding, the rows skipped after step 0 and
    the state feedback of the unroll)."""
    torch.manual_seed(0)
    model = tiny_llama()
    V, H = model.config.vocab_size, model.config.hidden_size
    vocab = torch.arange(V) if vocab_size is None else torch.randperm(V)[:vocab_size].sort().values
    drafter = eagle3.Eagle3Drafter.for_target(model, TAPS, vocab)
    drafter.init_from_target(model)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(0.05 * torch.randn_like(p))  # away from the structured initialisation
    steps = 3
    seqs = [Sequence(torch.randint(3, V, (p + t,)), p, {tap: torch.randn(p + t, H) for tap in TAPS})
            for p, t in ((9, 6), (12, 4), (4, 7))]
    batch = eagle3.ttt_batch(seqs, TAPS, None, torch.float32, "cpu")
    assert batch[3].tolist() == [3, 0, 8]       # left padding: every completion starts in column 12
    with torch.no_grad():
        outs = eagle3.ttt_unroll(drafter, model, batch, steps)
        for s, (logits, labels, _) in enumerate(outs):
            assert logits.shape[1] == len(vocab)
            k = 0
            for seq in seqs:
                n = len(seq.ids)
                feats = torch.cat([seq.taps[t] for t in TAPS], dim=-1)
                for j in range(n):
                    if seq.prompt_len <= j + s + 2 < n:   # labelled: a completion token
                        ref = _step_by_step(drafter, model, seq.ids, feats, j, s + 1)[s]
                        assert labels[k] == seq.ids[j + s + 2]
                        assert torch.allclose(logits[k], ref, atol=1e-4), (j, s)
                        k += 1
            assert k == len(labels)


def test_training_lowers_the_loss_and_writes_the_acceptance_proxy(trained):
    cfg = _config(trained["root"] / "ttt3")
    log = cfg["train_log"]
    first, last = sum(r["loss"] for r in log[:5]) / 5, sum(r["loss"] for r in log[-5:]) / 5
    assert last < 0.8 * first, (first, last)
    assert {"acc_step1", "acc_step2", "acc_step3"} <= set(log[-1])
    proxy = cfg["eval_proxy"]["overlap"]
    assert len(proxy["accuracy_per_step"]) == 3 and proxy["accuracy_per_step"][0] > 0.3
    acc = proxy["accuracy_per_step"]
    assert proxy["expected_accepted_chain"] == pytest.approx([acc[0], acc[0] + acc[0] * acc[1],
                                                              acc[0] + acc[0] * acc[1] + acc[0] * acc[1] * acc[2]])


def test_reduced_vocabulary_and_d2t(trained, tmp_path):
    """The draft vocabulary is the most frequent training labels; the export's d2t offsets map
    draft index i to target id i + d2t[i]; a full vocabulary writes no d2t (vLLM refuses one)."""
    state = load_file(trained["root"] / "ttt2_dv" / "model.safetensors")
    vocab = state["draft_vocab"]
    assert len(vocab) == 40 and torch.equal(vocab, vocab.sort().values)
    seqs = HiddenStates(str(trained["hidden"])).split("train", TAPS)   # the target's labels
    counts = torch.bincount(torch.cat([s.labels[s.labels >= 0] for s in seqs]), minlength=64)
    assert counts[vocab].min() >= counts[[t for t in range(64) if t not in set(vocab.tolist())]].max()
    assert state["lm_head.weight"].shape == (40, 32)
    eagle3.export_vllm(str(trained["root"] / "ttt2_dv"), str(trained["target_dir"]), str(tmp_path / "dv"))
    d2t = load_file(tmp_path / "dv" / "model.safetensors")["d2t"]
    assert torch.equal(torch.arange(40) + d2t, vocab)
    eagle3.export_vllm(str(trained["root"] / "ttt3"), str(trained["target_dir"]), str(tmp_path / "full"))
    assert "d2t" not in load_file(tmp_path / "full" / "model.safetensors")


def test_vllm_export_layout(trained, tmp_path):
    eagle3.export_vllm(str(trained["root"] / "ttt2_dv"), str(trained["target_dir"]), str(tmp_path / "e"))
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    model = trained["model"]
    H = model.config.hidden_size
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == 40 and cfg["vocab_size"] == 64 and cfg["target_hidden_size"] == H
    assert cfg["eagle_aux_hidden_state_layer_ids"] == TAPS
    assert cfg["attention_bias"] == (model.config.model_type == "qwen2")
    w = load_file(tmp_path / "e" / "model.safetensors")
    assert w["fc.weight"].shape == (H, 3 * H)
    assert w["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * H
    assert w["midlayer.self_attn.k_proj.weight"].shape[1] == 2 * H
    assert {"midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight", "midlayer.mlp.down_proj.weight",
            "norm.weight", "lm_head.weight", "d2t"} <= set(w)
    assert not any(k.startswith(("embed_tokens", "model.", "draft_vocab")) for k in w)


@pytest.mark.parametrize("params", [
    {"checkpoint": "ttt3", "draft_len": 2},
    {"checkpoint": "ttt3", "draft_len": 4},
    {"checkpoint": "ttt3", "draft_len": 4, "tree_topk": 3, "max_tree_nodes": 10},
    {"checkpoint": "ttt2_dv", "draft_len": 3, "tree_topk": 4, "max_tree_nodes": 16},
])
def test_lossless_fp32(trained, params):
    model = trained["model"]
    target = TargetModel(model)
    prop = build_proposer("eagle3", {**params, "checkpoint": str(trained["root"] / params["checkpoint"])}, target)
    rng = random.Random(3)
    prompts = [r["prompt_ids"] for r in trained["records"][:6]] + \
              [[rng.randrange(3, 64) for _ in range(9)] for _ in range(4)]
    accepted = 0
    for prompt in prompts:
        with torch.inference_mode():
            base = decode(TargetModel(model), prompt, 30, set()).output_ids
            r = decode(target, prompt, 30, set(), prop)
        assert r.output_ids == base
        accepted += sum(r.accepted)
    assert accepted > 0  # trained on these completions: some drafts must land


def _path_logprobs(prop, model, ids, path_tokens):
    """The drafter's log-probs of the token after `ids + path_tokens` (verified ids, then draft
    tokens fed back with the drafter's own states), from a fresh step-by-step computation."""
    target = TargetModel(model)
    fresh = build_proposer("eagle3", {"checkpoint": prop.cfg.checkpoint, "draft_len": 1}, target)
    _, hidden = target.prefill(ids[:-1], fresh.tap_layers)
    fresh.start(ids[:-1], hidden)
    n = len(ids)
    mask, pos = tree_attention_inputs(list(range(-1, n - 2)), 0, torch.float32)
    o, logp = fresh._run(fresh.queue, ids[1:], pos, mask)
    o, logp = o[-1:], logp[-1]
    for d, tok in enumerate(path_tokens, start=1):
        mask, pos = tree_attention_inputs([-1], n - 2 + d, torch.float32)
        o, lp = fresh._run(o, [tok], pos, mask)
        logp = lp[-1]
    return logp


def test_dynamic_tree_is_topk_expansion_of_exact_drafter_states(trained):
    """Every tree node is one of the top-k tokens of the drafter's distribution after its path
    (computed afresh along that path alone: the tree masks and positions are exact), parents
    come first, and the tree has the node budget."""
    model = trained["model"]
    target = TargetModel(model)
    prop = build_proposer("eagle3", {"checkpoint": str(trained["root"] / "ttt2_dv"), "draft_len": 3,
                                     "tree_topk": 3, "max_tree_nodes": 9}, target)
    prompt = trained["records"][5]["prompt_ids"]
    with torch.inference_mode():
        logits, hidden = target.prefill(prompt, prop.tap_layers)
        prop.start(prompt, hidden)
        ids = prompt + [int(logits[-1].argmax())]
        draft = prop.propose(ids)
        assert len(draft) == 9 and max(_depth(draft.parents, i) for i in range(9)) >= 2
        t2d = {t: i for i, t in enumerate(prop.drafter.draft_vocab.tolist())}
        for i, tok in enumerate(draft.tokens):
            path, node = [], draft.parents[i]
            while node != -1:
                path.insert(0, draft.tokens[node])
                node = draft.parents[node]
            logp = _path_logprobs(prop, model, ids, path)
            assert t2d[tok] in logp.topk(3).indices.tolist(), (i, path)
        # the drafter's cache holds only the verified rows again
        assert prop.cache.get_seq_length() == prop.committed == len(ids) - 1


def _depth(parents, i):
    d = 1
    while parents[i] != -1:
        i, d = parents[i], d + 1
    return d


@pytest.mark.parametrize("params", [{"draft_len": 3}, {"draft_len": 3, "tree_topk": 3, "max_tree_nodes": 8}])
def test_drafter_cache_matches_a_from_scratch_run_after_partial_acceptance(trained, params):
    """After every verification step the drafter's cache and its draft equal those of a fresh
    proposer that processes the verified sequence in one go."""
    def compare(prop, fresh, ids, draft, fresh_draft):
        assert fresh_draft.tokens == draft.tokens and fresh_draft.parents == draft.parents
        assert prop.committed == fresh.committed == len(ids) - 1
        a, b = prop.cache.layers[0], fresh.cache.layers[0]
        assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)

    checked, outcomes = check_against_fresh_proposer(
        trained["model"], "eagle3", {"checkpoint": str(trained["root"] / "ttt3"), **params},
        trained["records"][:4] + [{"prompt_ids": [5, 9, 13, 4, 22]}], compare)
    assert checked > 10
    assert 0 in outcomes and max(outcomes) >= 1  # both rejection and (partial) acceptance happened


def test_checkpoint_of_another_method_is_refused(trained, tmp_path):
    import shutil

    from specdec.train.checkpoint import CheckpointMismatch
    shutil.copytree(trained["root"] / "ttt3", tmp_path / "c")
    cfg = _config(tmp_path / "c")
    (tmp_path / "c" / "config.json").write_text(json.dumps({**cfg, "method": "mtp"}))
    with pytest.raises(CheckpointMismatch, match="for method 'mtp', not 'eagle3'"):
        build_proposer("eagle3", {"checkpoint": str(tmp_path / "c")}, TargetModel(trained["model"]))
