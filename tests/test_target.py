import random

import torch

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


def test_prepacked_bf16_linears_give_bit_identical_logits(tiny_model):
    """pack_linears routes bf16 CPU linears through oneDNN with prepacked weights: the prefill, a
    chain and a tree forward give exactly the logits of the unpacked model; other dtypes keep aten."""
    import copy

    from specdec.core.target import linear_route, pack_linears

    assert pack_linears(copy.deepcopy(tiny_model)) == "aten"          # fp32: untouched
    plain = copy.deepcopy(tiny_model).to(torch.bfloat16)
    packed_model = copy.deepcopy(plain)
    packed, ref = TargetModel(packed_model), TargetModel(plain, pack=False)
    if not torch.backends.mkldnn.is_available():
        assert packed.linear_route == "aten"
        return
    assert packed.linear_route == linear_route(packed_model) == "onednn_prepacked" and ref.linear_route == "aten"
    prompt = [5, 9, 3, 17, 22, 8, 40, 11]
    for t in (packed, ref):
        t.prefill(prompt)
    outs = []
    for t in (packed, ref):
        chain, _ = t.forward([12, 13, 14, 15])
        t.commit([0, 1])
        tree, _ = t.forward([30, 31, 32, 33, 34], [-1, 0, 0, 1, 2])
        t.commit([0, 2, 4])
        last, _ = t.prefill(prompt + [1, 2, 3])
        outs.append((chain, tree, last))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
