"""Distillation at scale: reference replies labelled by the target's prefill, the labels every
learned method trains on, the memory-mapped state file, training on a prefix of the records, the
eval proxy logged during training, and the learning curve in the report."""
import json

import pytest
import torch

from conftest import tiny_llama
from specdec.data.chat import build_chat_splits
from specdec.data.records import write_jsonl
from specdec.methods import eagle3, medusa, mtp, pard
from specdec.methods.draft_lm import IGNORE, causal_batch
from specdec.train import loop
from specdec.train.hidden import HiddenStates, Sequence, write_hidden_states
from test_models_data import CharTokenizer


def _relabelled(ids, prompt_len, shift=7, V=64):
    """A sequence whose labels are NOT its next tokens (a reference reply the target would not
    have written): label t = (ids[t + 1] + shift) mod V at the completion positions."""
    s = Sequence(torch.tensor(ids), prompt_len, {})
    s.labels = torch.where(s.labels >= 0, (s.labels + shift) % V, s.labels)
    return s


def test_default_labels_are_the_next_tokens_of_the_completion():
    s = Sequence(torch.tensor([5, 6, 7, 8, 9]), 2, {})
    assert s.labels.tolist() == [-1, 7, 8, 9, -1]
    c = s.clip(1)
    assert c.ids.tolist() == [6, 7, 8, 9] and c.prompt_len == 1 and c.labels.tolist() == [7, 8, 9, -1]


def test_every_batch_builder_reads_the_labels_not_the_next_tokens():
    """The drafters learn what the target says after each prefix, which on a reference reply
    differs from the reply's next token: each method's training batch carries Sequence.labels."""
    ids, p = [10, 11, 12, 13, 14, 15], 2
    s = _relabelled(ids, p)
    lab = s.labels.tolist()                       # [-1, 19, 20, 21, 22, -1]
    # draft model: position t predicts label t
    b = causal_batch([s], pad_id=0)
    assert b.labels[0].tolist() == [IGNORE, 19, 20, 21, 22, IGNORE]
    # PARD: segment 0 and the masks (t, j) predict the target's token at t + j + 1, i.e. label t + j
    cfg = pard.PardTrainConfig(pard_token=99, train_draft_len=2)
    tokens, positions, _, labels, _ = pard.pard_example(ids, p, cfg, None, lab)
    for tok, pos, y in zip(tokens, positions, labels):
        if tok == 99:
            assert y == lab[pos]                  # a mask at position t + j is labelled label (t + j)
    assert labels[:len(ids)] == [IGNORE if x < 0 else x for x in lab]
    # Medusa: head k at position t predicts the target's token at t + 1 + k (label t + k)
    H = 4
    s.taps = {3: torch.randn(len(ids), H)}
    _, y, _ = medusa.head_examples([s], 3, torch.nn.Identity(), 2)
    assert y.tolist() == [[20, 21], [21, 22], [22, -100], [-100, -100]]
    # MTP: targets[c] is the target's token at column c
    _, _, targets, _ = mtp.pad_batch([s], 3)
    assert targets[0].tolist() == [-1, -1, 19, 20, 21, 22]
    # EAGLE-3: the same, after left padding
    s.taps = {1: torch.randn(len(ids), H)}
    other = Sequence(torch.tensor([3, 4, 5, 6]), 1, {1: torch.randn(4, H)})
    _, _, targets, start, _ = eagle3.ttt_batch([s, other], [1], None, torch.float32, "cpu")
    assert start.tolist() == [0, 1]          # both completions start in column 2
    assert targets.tolist() == [[-1, -1, 19, 20, 21, 22], [-1, -1, 4, 5, 6, -1]]


def test_reference_training_records_keep_the_reply_and_the_eval_records_are_greedy():
    turns = [(f"s{i}", f"Question number {i}: what is {i} plus {i}?", f"It is {2 * i}." if i % 5 else None)
             for i in range(40)]
    model = tiny_llama()
    tok = CharTokenizer()
    splits = build_chat_splits(turns, model, tok, {2}, prefix="chat", train_prompts=6, heldout_prompts=3,
                               eval_overlap_prompts=2, completion_tokens=6, min_chars=10, max_chars=200,
                               max_prompt_tokens=100, batch_size=4, seed=0, train_completions="reference")
    train, held = splits["train"], splits["eval_heldout"]
    assert [r["completion_source"] for r in train] == ["greedy"] * 2 + ["reference"] * 4
    assert all(r["completion_source"] == "greedy" for r in held) and splits["eval_overlap"] == train[:2]
    by_id = {i: (q, a) for i, q, a in turns}
    for r in train[2:]:
        reply = by_id[r["source_id"]][1]
        assert reply is not None and "reply" not in r
        want = tok(reply)["input_ids"]
        assert r["completion_ids"] == (want + [2] if len(want) < 6 else want[:6])
    # the held-out prompts come first in the seeded shuffle: a larger training set keeps them
    bigger = build_chat_splits(turns, model, tok, {2}, prefix="chat", train_prompts=10, heldout_prompts=3,
                               eval_overlap_prompts=2, completion_tokens=6, min_chars=10, max_chars=200,
                               max_prompt_tokens=100, batch_size=4, seed=0, train_completions="reference")
    assert [r["prompt"] for r in bigger["eval_heldout"]] == [r["prompt"] for r in held]
    with pytest.raises(ValueError, match="train_completions"):
        build_chat_splits(turns, model, tok, {2}, prefix="chat", train_prompts=6, heldout_prompts=3,
                          eval_overlap_prompts=2, completion_tokens=6, min_chars=10, max_chars=200,
                          max_prompt_tokens=100, batch_size=4, seed=0, train_completions="sampled")


@pytest.fixture(scope="module")
def reference_states(tmp_path_factory):
    """A tiny target and a state file over records whose completions are random text (reference
    replies) and records whose completions are the target's greedy output."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("ref")
    model = tiny_llama()
    model.save_pretrained(root / "target")
    gen = torch.Generator().manual_seed(0)
    records = []
    for i in range(6):
        prompt = torch.randint(3, 64, (5 + i,), generator=gen).tolist()
        if i < 2:   # greedy
            with torch.no_grad():
                out = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0)
            completion = out[0, len(prompt):].tolist()
        else:
            completion = torch.randint(3, 64, (6,), generator=gen).tolist()
        records.append({"id": f"r{i}", "prompt": "", "prompt_ids": prompt, "completion_ids": completion})
    write_jsonl(root / "train.jsonl", records)
    write_hidden_states(str(root / "target"), {"train": str(root / "train.jsonl")}, [1, 3],
                        str(root / "h.safetensors"), dtype="float32", batch_size=4, store_dtype="bfloat16",
                        soft_topk=5)
    return model, records, HiddenStates(str(root / "h.safetensors"))


def test_state_file_labels_are_the_targets_argmax_and_states_are_stored_in_bf16(reference_states):
    model, records, hs = reference_states
    seqs = hs.split("train", [1, 3])
    assert hs.meta["store_dtype"] == "bfloat16" and seqs[0].taps[3].dtype == torch.bfloat16
    for r, s in zip(records, seqs):
        p, n = len(r["prompt_ids"]), len(s.ids)
        with torch.no_grad():
            out = model(s.ids[None], output_hidden_states=True)
        argmax = out.logits[0].argmax(-1)
        assert s.labels[:p - 1].eq(-1).all() and s.labels[n - 1] == -1
        assert torch.equal(s.labels[p - 1:n - 1], argmax[p - 1:n - 1])
        assert torch.allclose(s.taps[1].float(), out.hidden_states[1][0], atol=2e-2, rtol=1e-2)
    # on the target's own greedy text the labels are that text's next tokens
    assert torch.equal(seqs[0].labels, Sequence(seqs[0].ids, seqs[0].prompt_len, {}).labels)
    # random reference text: the target would have said something else at most positions
    ref = seqs[4]
    assert not torch.equal(ref.labels, Sequence(ref.ids, ref.prompt_len, {}).labels)


def test_soft_labels_are_the_targets_top_k_log_probabilities(reference_states):
    model, records, hs = reference_states
    assert hs.split("train", [1])[0].soft is None          # only when asked for
    for r, s in zip(records, hs.split("train", [1], soft=True)):
        ids, logp = s.soft
        p, n = len(r["prompt_ids"]), len(s.ids)
        with torch.no_grad():
            ref = torch.log_softmax(model(s.ids[None]).logits[0].float(), -1).topk(5, dim=-1)
        assert ids[:p - 1].eq(-1).all() and ids[n - 1].eq(-1).all() and logp[n - 1].eq(float("-inf")).all()
        assert torch.equal(ids[p - 1:n - 1, 0].long(), s.labels[p - 1:n - 1])      # top-1 is the label
        assert torch.equal(ids[p - 1:n - 1].long(), ref.indices[p - 1:n - 1])
        assert torch.allclose(logp[p - 1:n - 1], ref.values[p - 1:n - 1], atol=1e-4)
        sid, slp = s.soft_targets                                                # aligned with targets
        assert torch.equal(sid[1:], ids[:-1]) and sid[0].eq(-1).all()


def test_soft_cross_entropy():
    from specdec.train.soft import soft_cross_entropy, to_drafter
    gen = torch.Generator().manual_seed(0)
    logits, target = torch.randn(6, 10, generator=gen), torch.randn(6, 10, generator=gen)
    logq = torch.log_softmax(target, -1)
    full = soft_cross_entropy(logits, torch.arange(10).expand(6, 10), logq)     # K = V: CE to the whole q
    assert torch.allclose(full, -(logq.exp() * torch.log_softmax(logits, -1)).sum(-1).mean())
    top = logq.topk(1, dim=-1)                                                   # K = 1: the hard CE
    assert torch.allclose(soft_cross_entropy(logits, top.indices, top.values),
                          torch.nn.functional.cross_entropy(logits, top.indices[:, 0]))
    # a reduced vocabulary: tokens outside it drop out and q renormalises over the rest
    t2d = torch.tensor([0, 1, 2, -1, -1, 3, 4, 5, 6, 7])
    ids = torch.tensor([[3, 5], [4, 3]])
    d = to_drafter(ids, t2d)
    assert d.tolist() == [[-1, 3], [-1, -1]]
    lp = torch.log_softmax(logits[:2, :8], -1)
    assert torch.allclose(soft_cross_entropy(logits[:2, :8], d, torch.zeros(2, 2)), -lp[0, 3])   # row 2: none left


def test_a_prefix_of_the_records_and_a_clear_error_past_the_end(reference_states):
    _, records, hs = reference_states
    assert [s.ids.tolist() for s in hs.split("train", [1], records=3)] == \
        [r["prompt_ids"] + r["completion_ids"] for r in records[:3]]
    with pytest.raises(ValueError, match="has 6 records, 7 requested"):
        hs.split("train", [1], records=7)


def test_eval_proxy_is_logged_during_training(tmp_path):
    module = torch.nn.Linear(2, 1)
    x, y = torch.randn(16, 2), torch.randn(16, 1)
    calls = []

    def loss_fn(m, step):
        return torch.nn.functional.mse_loss(m(x), y), {}

    def evaluate(m):
        calls.append(m.training)
        return {"heldout": {"mse": torch.nn.functional.mse_loss(m(x), y).item()}}

    cfg = loop.TrainConfig(steps=10, batch_size=1, lr=0.05, warmup_steps=0, save_every=100, log_every=5, eval_every=4)
    log = loop.train(module, loss_fn, cfg, tmp_path, "run", evaluate=evaluate)
    evals = [r for r in log if "eval" in r]
    assert [r["step"] for r in evals] == [4, 8] and calls == [False, False]
    assert evals[1]["eval"]["heldout"]["mse"] < evals[0]["eval"]["heldout"]["mse"]
    assert "loss" in log[-1] and log[-1]["step"] == 10


def test_learning_curve_table_and_plot(tmp_path):
    from specdec.report.build import write_learning_curve
    from specdec.report.tables import learning_curve_frame, render_learning_curve
    dirs = []
    for n, acc in ((100, 0.2), (1000, 0.4), (300, 0.3)):
        d = tmp_path / f"c{n}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps({
            "method": "eagle3", "train": {"steps": 300, "batch_size": 8, "train_records": n},
            "eval_proxy": {"overlap": {"accuracy_per_step": [0.9]}, "heldout": {"accuracy_per_step": [acc, 0.1]}},
            "train_log": []}))
        dirs.append(str(d))
    curve = learning_curve_frame(dirs)
    assert curve["records"].tolist() == [100, 300, 1000]
    assert curve["heldout_step1"].tolist() == [0.2, 0.3, 0.4]
    assert curve["passes"].tolist() == [24.0, 8.0, 2.4]
    md = render_learning_curve(curve)
    assert " 1000 |" in md and "40.0%" in md
    out = tmp_path / "results"
    write_learning_curve(dirs, str(out / "learning_curve.md"), str(out / "plots" / "learning_curve.png"))
    table = (out / "learning_curve.md").read_text()
    assert "from 20.0% with 100 records to 40.0% with 1000" in table
    assert "![learning curve](plots/learning_curve.png)" in table
    assert (out / "plots" / "learning_curve.png").stat().st_size > 0
    (tmp_path / "c300" / "config.json").write_text(json.dumps({"method": "eagle3", "train": {"steps": 3}}))
    with pytest.raises(ValueError, match="c300.*train_records"):
        learning_curve_frame(dirs)
