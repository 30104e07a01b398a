import pytest
import torch

from conftest import tiny_llama
from specdec.data.chat import build_chat_splits
from specdec.data.wiki import build_wiki_set
from specdec.models import CheckpointError, load_causal_lm


class CharTokenizer:
    """Stands in for the target's tokenizer: one id per character, a fixed chat template."""
    pad_token_id = 0
    eos_token_id = 2

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, return_dict=False):
        text = "<u>" + messages[0]["content"] + "<a>"
        return [3 + (ord(c) % 60) for c in text]

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [3 + (ord(c) % 60) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) for i in ids)


def test_missing_and_corrupt_checkpoints_name_the_path(tmp_path):
    with pytest.raises(CheckpointError, match=str(tmp_path / "nope")):
        load_causal_lm(tmp_path / "nope")
    ckpt = tmp_path / "ckpt"
    tiny_llama().save_pretrained(ckpt)
    assert load_causal_lm(ckpt).config.hidden_size == 32  # round trip
    (ckpt / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=f"{ckpt}: cannot load checkpoint"):
        load_causal_lm(ckpt)


def test_chat_splits_format_and_disjointness():
    turns = [(f"s{i}", f"Question number {i}: what is {i} plus {i}?", None) for i in range(40)]
    turns += [("dup", "Question number 3: what is 3 plus 3?", None), ("short", "hi", None),
              ("uni", "日本語の質問です" * 3, None)]
    model = tiny_llama()
    splits = build_chat_splits(turns, model, CharTokenizer(), {2}, prefix="chat", train_prompts=6,
                               heldout_prompts=3, eval_overlap_prompts=2, completion_tokens=5,
                               min_chars=10, max_chars=200, max_prompt_tokens=100, batch_size=4, seed=0)
    train, overlap, held = splits["train"], splits["eval_overlap"], splits["eval_heldout"]
    assert len(train) == 6 and len(held) == 3 and overlap == train[:2]
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    for r in train + held:
        assert set(r) >= {"id", "prompt", "prompt_ids", "completion_ids", "completion_text"}
        assert 1 <= len(r["completion_ids"]) <= 5
        assert r["source_id"] not in ("dup", "short", "uni")
    # completions are the target's greedy continuations (batched generation == one at a time)
    r = train[0]
    with torch.inference_mode():
        ref = model.generate(torch.tensor([r["prompt_ids"]]), max_new_tokens=5, do_sample=False,
                             eos_token_id=[2], pad_token_id=0)[0, len(r["prompt_ids"]):].tolist()
    cut = next((j + 1 for j, t in enumerate(ref) if t == 2), len(ref))
    assert r["completion_ids"] == ref[:cut]


def test_wiki_set_respects_budget_and_names_the_last_article():
    arts = {"Science": [{"title": f"T{i}", "extract": f"Article {i} text. " * (i + 2), "topic": "Science"}
                        for i in range(12)],
            "Arts": [{"title": f"A{i}", "extract": f"Painting {i}. " * 3, "topic": "Arts"} for i in range(5)]}
    recs = build_wiki_set(arts, CharTokenizer(), num_questions=4, prompt_token_budget=300, max_articles=3, seed=1)
    assert len(recs) == 4 and len({r["title"] for r in recs}) == 4
    for r in recs:
        assert len(r["prompt_ids"]) <= 300
        assert r["articles"][-1] == r["title"] and len(r["articles"]) <= 3
        assert f'Copy the text of the article "{r["title"]}"' in r["prompt"]
        assert r["reference_text"] in r["prompt"]


def test_prefill_labels_are_the_targets_argmax_over_the_reply(tiny_model):
    """The prefill route: one padded batch gives, for every reply position, the target's own next
    token, as a forward over each sequence alone does; on the target's greedy text the labels are
    that text (self-distillation reproduces the generate route there)."""
    from specdec.data.distill import prefill_labels
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 64, (n,), generator=gen).tolist() for n in (9, 17, 5, 12)]
    starts = [4, 10, 2, 12]
    labels, stats = prefill_labels(tiny_model, seqs, starts, batch_size=3)
    for s, a, lab in zip(seqs, starts, labels):
        with torch.no_grad():
            alone = tiny_model(input_ids=torch.tensor([s])).logits[0].argmax(-1).tolist()
        assert lab == alone[a - 1:]
    assert stats["label_tokens"] == sum(len(s) - a + 1 for s, a in zip(seqs, starts)) and stats["seconds"] > 0
    prompt = [5, 9, 11]
    text = tiny_model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                               pad_token_id=0)[0].tolist()
    labels, _ = prefill_labels(tiny_model, [text], [len(prompt)], batch_size=1)
    assert labels[0][:-1] == text[len(prompt):]


def test_sharegpt_first_exchanges_pair_a_prompt_with_its_reply():
    import json

    from specdec.data.distill import first_exchanges
    convs = [{"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
             {"id": "b", "conversations": [{"from": "gpt", "value": "x"}, {"from": "human", "value": "y"}]},
             {"id": "c", "conversations": [{"from": "human", "value": "only a question"}]}]
    text = json.dumps(convs)[:-30]   # the shipped file is cut off mid-record
    assert list(first_exchanges(text)) == [("a", "hi", "hello")]
