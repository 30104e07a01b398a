"""The draft-model family on tiny random targets: the standalone draft LM (derived from the
target, trained, saved as a Hugging Face checkpoint), its cache rollback, PARD's mask-token
inputs, labels and COD, losslessness, and the Hugging Face assisted-generation peer."""
import json
import random

import pytest
import torch

from conftest import distillation_set, tiny_llama, tiny_qwen2
from specdec.backends.hf_generate import hf_decode, peer_kwargs
from specdec.core.loop import decode
from specdec.core.target import TargetModel
from specdec.methods import build_proposer, draft_model, pard, train_checkpoint
from specdec.methods.draft_lm import (
    IGNORE,
    DraftLMConfig,
    causal_batch,
    default_init_layers,
    derive_from_target,
    load_draft_lm,
)
from specdec.train.checkpoint import CheckpointMismatch
from specdec.train.hidden import Sequence

FAST = {"steps": 60, "batch_size": 8, "lr": 2e-2, "warmup_steps": 2, "save_every": 25, "log_every": 1}


def greedy(model, prompt, n):
    with torch.inference_mode():
        return decode(TargetModel(model), prompt, n, set()).output_ids


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def trained(request, tmp_path_factory):
    torch.set_num_threads(1)
    model = tiny_llama() if request.param == "llama" else tiny_qwen2()
    out = distillation_set(model, tmp_path_factory.mktemp(f"draft-{request.param}"), [1], token_hi=63)
    root, target_dir, hidden, records = out["root"], out["target_dir"], out["hidden"], out["records"]
    used = {t for r in records for t in r["prompt_ids"] + r["completion_ids"]}
    pard_token = max(set(range(model.config.vocab_size)) - used)   # a token the data never uses
    draft_settings = {"num_layers": 2, "init_layers": [0, 2]}
    train_checkpoint("draft_model", str(hidden), str(target_dir), str(root / "draft"),
                                 {"train": FAST, "draft": draft_settings}, overlap=4)
    train_checkpoint("pard", str(hidden), str(target_dir), str(root / "pard"),
                          {"train": FAST, "draft": draft_settings,
                           "pard": {"pard_token": pard_token, "train_draft_len": 4}}, overlap=4)
    return {"pard_token": pard_token, "model": model, "root": root, "target_dir": target_dir, "hidden": hidden,
            "records": records}


def _meta(ckpt):
    return json.loads((ckpt / "specdec.json").read_text())


# ---- building the draft ----------------------------------------------------------------------
def test_default_init_layers_are_the_first_ones():
    assert default_init_layers(30, 4) == [0, 1, 2, 3]
    assert default_init_layers(3, 5) == [0, 1, 2]


def test_derived_draft_copies_the_chosen_target_layers():
    target = tiny_llama()
    draft, layers = derive_from_target(target, DraftLMConfig(num_layers=2, init_layers=[2, 0]))
    assert layers == [2, 0] and draft.config.num_hidden_layers == 2
    t, d = target.state_dict(), draft.state_dict()
    assert torch.equal(d["model.layers.0.mlp.up_proj.weight"], t["model.layers.2.mlp.up_proj.weight"])
    assert torch.equal(d["model.layers.1.self_attn.q_proj.weight"], t["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(d["model.embed_tokens.weight"], t["model.embed_tokens.weight"])
    assert torch.equal(d["model.norm.weight"], t["model.norm.weight"])
    with pytest.raises(ValueError, match="init_layers"):
        derive_from_target(target, DraftLMConfig(num_layers=2, init_layers=[0, 3]))


# ---- training data ---------------------------------------------------------------------------
def test_causal_batch_labels_only_completion_tokens():
    seqs = [Sequence(torch.tensor([5, 6, 7, 8, 9]), 2, {}), Sequence(torch.tensor([5, 6, 7]), 1, {})]
    b = causal_batch(seqs, pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]]
    assert b.labels.tolist() == [[IGNORE, 7, 8, 9, IGNORE], [6, 7, IGNORE, IGNORE, IGNORE]]
    assert b.attention_mask is None


def test_pard_example_matches_a_hand_built_one():
    """x = 10 11 | 12 13 14 (prompt of 2), K = 3: segment 0 is plain next-token prediction from
    the last prompt token; mask (t, j) sits at position t+j, sees x_0..x_t and its own anchor's
    earlier masks, and is labelled x_(t+j+1)."""
    cfg = pard.PardTrainConfig(pard_token=99, train_draft_len=3)
    tokens, positions, allowed, labels, label_pos = pard.pard_example([10, 11, 12, 13, 14], 2, cfg)
    M = 99
    assert tokens == [10, 11, 12, 13, 14, M, M, M]
    #                  x0 x1 x2 x3 x4 (1,1) (2,1) (1,2)
    assert positions == [0, 1, 2, 3, 4, 2, 3, 3]
    assert labels == [IGNORE, 12, 13, 14, IGNORE, 13, 14, 14]
    assert label_pos == [0, 1, 1, 1, 0, 2, 2, 3]
    want = torch.tensor([
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0, 1, 0, 0],   # mask (1,1): x0 x1 + itself
        [1, 1, 1, 0, 0, 0, 1, 0],   # mask (2,1): x0..x2 + itself
        [1, 1, 0, 0, 0, 1, 0, 1],   # mask (1,2): x0 x1, mask (1,1), itself
    ], dtype=torch.bool)
    assert torch.equal(allowed, want)


def test_pard_training_view_equals_the_inference_forward():
    """Every mask node of a packed example gets the logits the draft produces at inference for
    context x_0..x_t followed by j masks."""
    model = tiny_llama()
    cfg = pard.PardTrainConfig(pard_token=60, train_draft_len=4)
    ids = [5, 9, 3, 17, 22, 8, 30, 4, 12]
    b = pard.pard_batch([Sequence(torch.tensor(ids), 3, {})], cfg, 0, None)
    mask = torch.zeros(b.attention_mask.shape).masked_fill_(~b.attention_mask, torch.finfo(torch.float32).min)
    with torch.no_grad():
        packed = model(input_ids=b.input_ids, position_ids=b.position_ids, attention_mask=mask).logits[0]
        tok = b.input_ids[0].tolist()
        pos = b.position_ids[0].tolist()
        for i in range(len(ids), len(tok)):
            j = int(b.position_of_label[0, i]) - 1        # mask offset
            t = pos[i] - j                                 # its anchor
            ref = model(torch.tensor([ids[:t + 1] + [60] * j])).logits[0, -1]
            assert torch.allclose(packed[i], ref, atol=1e-4), (i, t, j)


def test_cod_keeps_nested_shrinking_segments():
    cfg = pard.PardTrainConfig(pard_token=99, train_draft_len=6, cod_ratio=0.7, cod_min_ratio=0.2)
    assert [round(pard.keep_ratio(j, cfg), 4) for j in range(6)] == [1.0, 0.7, 0.49, 0.343, 0.2401, 0.2]
    ids = list(range(100, 600))
    u = torch.rand(len(ids), generator=torch.Generator().manual_seed(0))
    _, positions, _, _, label_pos = pard.pard_example(ids, 1, cfg, u)
    kept = {}
    for p, lp in zip(positions[len(ids):], label_pos[len(ids):]):
        kept.setdefault(lp - 1, set()).add(p - (lp - 1))   # segment j -> anchors
    anchors = len(ids) - 2
    for j in range(1, 6):
        share = len(kept[j]) / (anchors - j + 1)
        assert abs(share - pard.keep_ratio(j, cfg)) < 0.08, (j, share)   # 500 draws
        if j > 1:
            assert kept[j] <= kept[j - 1] | set(range(anchors - j + 1, anchors + 1))  # nested
    # no draws: every node kept
    _, _, _, _, lp_all = pard.pard_example(ids[:10], 1, cfg, None)
    assert sum(1 for x in lp_all if x > 1) == sum(9 - j for j in range(1, 6))   # anchors t <= n-2-j


# ---- training --------------------------------------------------------------------------------
@pytest.mark.parametrize("ckpt", ["draft", "pard"])
def test_training_lowers_the_loss_and_writes_a_standalone_checkpoint(trained, ckpt):
    d = trained["root"] / ckpt
    log = _meta(d)["train_log"]
    first, last = sum(r["loss"] for r in log[:5]) / 5, sum(r["loss"] for r in log[-5:]) / 5
    assert last < 0.9 * first, (first, last)  # deterministic: seeded init and data order
    hf = json.loads((d / "config.json").read_text())
    assert hf["vocab_size"] == trained["model"].config.vocab_size and hf["num_hidden_layers"] == 2
    assert (d / "model.safetensors").is_file() and not (d / "resume.pt").exists()
    if ckpt == "pard":
        assert hf["pard_token"] == trained["pard_token"] and hf["spd_type"] == "pard"
        proxy = _meta(d)["eval_proxy"]["overlap"]["top1_accuracy_per_position"]
        assert len(proxy) == 4


def test_checkpoint_round_trip(trained):
    """What was saved loads back (as Hugging Face loads it) with the same weights and outputs."""
    from transformers import AutoModelForCausalLM
    d = trained["root"] / "pard"
    meta, model = load_draft_lm(str(d), "pard", trained["model"].config)
    again = AutoModelForCausalLM.from_pretrained(d)
    ids = torch.tensor([[5, 9, 3, 17]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    assert meta["config"]["pard"]["pard_token"] == trained["pard_token"]
    assert meta["config"]["draft"]["init_layers"] == [0, 2]


def test_pard_token_used_by_the_data_is_refused(trained, tmp_path):
    used = trained["records"][0]["prompt_ids"][0]
    with pytest.raises(ValueError, match=f"pard_token {used} occurs"):
        train_checkpoint("pard", str(trained["hidden"]), str(trained["target_dir"]), str(tmp_path / "p"),
                              {"train": {**FAST, "steps": 1}, "draft": {"num_layers": 1},
                               "pard": {"pard_token": used}}, overlap=4)


def test_other_vocabulary_or_method_is_refused(trained):
    cfg = trained["model"].config
    other = type(cfg).from_dict({**cfg.to_dict(), "vocab_size": cfg.vocab_size + 8})
    with pytest.raises(CheckpointMismatch, match="vocab_size is 64 but the target model's vocab_size is 72"):
        load_draft_lm(str(trained["root"] / "draft"), "draft_model", other)
    with pytest.raises(CheckpointMismatch, match="for method 'pard', not 'draft_model'"):
        load_draft_lm(str(trained["root"] / "pard"), "draft_model", cfg)


def test_draft_cache_after_partial_acceptance_equals_a_fresh_prefill(trained):
    """After every step the draft's cache holds exactly the KV a from-scratch prefill of the
    verified tokens it has consumed would hold."""
    model = trained["model"]
    target = TargetModel(model)
    prop = build_proposer("draft_model", {"checkpoint": str(trained["root"] / "draft"), "draft_len": 3}, target)
    partial = 0
    for r in trained["records"][4:10]:
        prompt = r["prompt_ids"]

        class Spy:
            prompt_len = len(prompt)
            tap_layers = ()
            drafts_from_prompt = prop.drafts_from_prompt
            start = prop.start

            def propose(self, ids, max_depth=None):
                d = prop.draft
                if len(ids) == self.prompt_len:   # the first draft: from the prompt, an empty cache
                    assert d.cached == 0
                    return prop.propose(ids, max_depth)
                # before drafting: the cache is a prefix of the verified sequence
                fresh = TargetModel(d.model)
                with torch.inference_mode():
                    fresh.prefill(ids[:d.cached])
                for a, b in zip(d.cache.layers, fresh.cache.layers):
                    assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)
                assert d.cached >= len(ids) - 2   # at most the last draft token and the bonus are new
                draft = prop.propose(ids, max_depth)
                if len(draft) > 1 and len(ids) % 2:
                    # the tiny draft is right almost always: make every other draft wrong at its
                    # last token (its own cache still holds what it drafted), so the target
                    # accepts only a part of it
                    draft.tokens[-1] = (draft.tokens[-1] + 1) % model.config.vocab_size
                return draft

            def observe(self, step):
                nonlocal partial
                partial += 0 < len(step.accepted) < prop.cfg.draft_len
                prop.observe(step)
        with torch.inference_mode():
            out = decode(target, prompt, 24, set(), Spy()).output_ids
        assert out == greedy(model, prompt, 24)
    assert partial > 0


@pytest.mark.parametrize("method,k,extra", [("draft_model", 1, {}), ("draft_model", 4, {}),
                                            ("draft_model", 4, {"confidence_threshold": 1.0}),
                                            ("pard", 2, {}), ("pard", 5, {})])
def test_lossless_in_fp32(trained, method, k, extra):
    model = trained["model"]
    target = TargetModel(model)
    ckpt = trained["root"] / ("draft" if method == "draft_model" else "pard")
    prop = build_proposer(method, {"checkpoint": str(ckpt), "draft_len": k, **extra}, target)
    accepted, drafted = 0, set()
    rng = random.Random(1)
    prompts = [r["prompt_ids"] for r in trained["records"][:6]] + \
              [[rng.randrange(3, 63) for _ in range(9)] for _ in range(4)]   # unseen prompts too
    for prompt in prompts:
        with torch.inference_mode():
            res = decode(target, prompt, 30, {2}, prop)
        assert res.output_ids == decode(TargetModel(model), prompt, 30, {2}).output_ids
        # every step drafts, except a last one with one token left (a step emits drafts + 1)
        assert all(0 < d <= k for d in res.drafted[:-1]) and 0 <= res.drafted[-1] <= k
        accepted += sum(res.accepted)
        drafted.update(res.drafted)
    assert accepted > 0   # the trained drafts agree with the target somewhere
    if extra:
        assert drafted - {0} == {1}   # no draft token has probability 1: every draft stops after one


def test_pard_drafts_k_tokens_from_one_forward(trained):
    target = TargetModel(trained["model"])
    prop = build_proposer("pard", {"checkpoint": str(trained["root"] / "pard"), "draft_len": 4}, target)
    prompt = trained["records"][2]["prompt_ids"]
    calls = []
    real = prop.draft.model.forward

    def counting(*a, **kw):
        calls.append(kw["input_ids"].shape[1])
        return real(*a, **kw)
    prop.draft.model.forward = counting
    with torch.inference_mode():
        prop.start(prompt, None)
        calls.clear()
        draft = prop.propose(prompt)                # drafts_from_prompt: the last prompt token is pending
        assert len(draft) == 4 and calls == [len(prompt) + 3]   # the prompt + 3 masks, one forward
        assert prop.draft.cached == len(prompt)         # the masks' KV is gone
        calls.clear()
        draft = prop.propose(prompt + draft.tokens[:2] + [7])   # two accepted, then the target's 7
    assert len(draft) == 4 and calls == [3 + 3]    # accepted + pending, then the masks
    assert prop.draft.cached == len(prompt) + 3


def test_hf_assisted_generation_peer_uses_the_same_draft(trained):
    model = trained["model"]
    kwargs = peer_kwargs("hf_assisted", {"checkpoint": str(trained["root"] / "draft"), "num_assistant_tokens": 3},
                         model)
    assert kwargs["assistant_model"].config.num_hidden_layers == 2
    prompt = trained["records"][1]["prompt_ids"]
    lengths = []   # tokens in each target forward
    hook = model.register_forward_pre_hook(lambda _, args, kw: lengths.append(kw["input_ids"].shape[1]),
                                           with_kwargs=True)
    try:
        res = hf_decode(model, prompt, 20, {2}, kwargs)
    finally:
        hook.remove()
    assert res.output_ids == decode(TargetModel(model), prompt, 20, {2}).output_ids
    # its first target forward is the prompt plus the first candidates, as its record says
    assert res.fused_first_step and lengths[0] > len(prompt)


@pytest.mark.parametrize("threshold", [0.0, 0.4])
def test_our_draft_loop_makes_no_more_forwards_than_hf_assisted_generation(trained, threshold):
    """Same draft, same policy (3 tokens, stop below the confidence threshold): our loop runs no
    more target or draft forwards than transformers' assisted generation (both verify the first
    draft in the prefill's forward) and emits the same tokens."""
    model = trained["model"]
    ckpt = str(trained["root"] / "draft")
    kwargs = peer_kwargs("hf_assisted", {"checkpoint": ckpt, "num_assistant_tokens": 3,
                                         "num_assistant_tokens_schedule": "constant",
                                         "assistant_confidence_threshold": threshold}, model)
    prop = build_proposer("draft_model", {"checkpoint": ckpt, "draft_len": 3,
                                          "confidence_threshold": threshold}, TargetModel(model))
    counts = {}

    def count(name):
        return lambda *_: counts.__setitem__(name, counts.get(name, 0) + 1)
    hooks = [model.register_forward_pre_hook(count("target")),
             kwargs["assistant_model"].register_forward_pre_hook(count("draft")),
             prop.draft.model.register_forward_pre_hook(count("draft"))]
    ours, theirs = {"target": 0, "draft": 0}, {"target": 0, "draft": 0}
    try:
        for r in trained["records"][:6]:
            counts.clear()
            a = decode(TargetModel(model), r["prompt_ids"], 20, {2}, prop).output_ids
            ours = {k: ours[k] + counts.get(k, 0) for k in ours}
            counts.clear()
            b = hf_decode(model, r["prompt_ids"], 20, {2}, kwargs).output_ids
            theirs = {k: theirs[k] + counts.get(k, 0) for k in theirs}
            assert a == b
    finally:
        for h in hooks:
            h.remove()
    assert 0 < ours["target"] <= theirs["target"] and 0 < ours["draft"] <= theirs["draft"], (ours, theirs)


def test_vllm_exports_are_plain_hugging_face_drafts(trained, tmp_path):
    """The exports vLLM loads as speculative_config.model: the HF files, target vocabulary, and
    for PARD the pard_token its parallel drafting reads; our metadata stays behind."""
    from transformers import AutoModelForCausalLM

    from specdec.methods import vllm_config as speculative_config
    for method, ckpt in (("draft_model", "draft"), ("pard", "pard")):
        out = tmp_path / method
        build_module = draft_model if method == "draft_model" else pard
        build_module.export_vllm(str(trained["root"] / ckpt), str(trained["target_dir"]), str(out))
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["vocab_size"] == trained["model"].config.vocab_size
        assert not (out / "specdec.json").exists() and (out / "manifest.json").exists()
        assert ("pard_token" in cfg) == (method == "pard")
        assert AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 2
        spec = speculative_config(method, {"checkpoint": str(trained["root"] / ckpt), "draft_len": 3}, str(out))
        assert spec["model"] == str(out) and spec["num_speculative_tokens"] == 3
        assert spec.get("parallel_drafting", False) == (method == "pard")
    with pytest.raises(CheckpointMismatch, match="not 'pard'"):
        pard.export_vllm(str(trained["root"] / "draft"), str(trained["target_dir"]), str(tmp_path / "x"))


def test_pretrained_init_is_padded_to_the_target_vocabulary(tmp_path):
    """Full scale starts from a pretrained base (Qwen2.5-0.5B-Instruct, vocab 151,936) for a
    target with a larger embedding (152,064): the draft is padded to the target's size; a base
    with a larger vocabulary is refused."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec.methods.draft_lm import from_pretrained_init
    target = tiny_llama()
    for vocab in (56, 72):
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
        LlamaForCausalLM(cfg).save_pretrained(tmp_path / f"base{vocab}")
    draft = from_pretrained_init(str(tmp_path / "base56"), target.config)
    assert draft.config.vocab_size == 64 and draft.get_input_embeddings().weight.shape == (64, 16)
    with pytest.raises(CheckpointMismatch, match="vocab_size 72 is larger than the target's 64"):
        from_pretrained_init(str(tmp_path / "base72"), target.config)
