"""What the full-scale config downloads from the hub, built locally and small, for the
full-scale-shaped smoke config (workflow/configs/full-scale-shaped.yaml, layered on
workflow/configs/full-scale.yaml):

- qwen2-target/: a random Qwen2ForCausalLM, Qwen2.5-7B-Instruct's architecture (untied embeddings,
  q/k/v biases, ChatML), with a byte-level BPE tokenizer trained on the fixture's text. The config's
  `target.hub` names this directory: the `source: hub` path copies it as it would download a repo.
- qwen2-draft/: a smaller random Qwen2 with the same tokenizer, in Qwen2.5-0.5B-Instruct's place
  (the draft model's and PARD's `init_model_path`).
- ultrachat_200k/data/train_sft-00000-of-00001.parquet: rows in ultrachat_200k's layout (prompt,
  prompt_id, messages), read by `datasets.load_dataset` as the hub data set is.

    python tests/full_scale_shaped.py DIR
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pard|>"]   # ids 0..3; <|pard|>: PARD's mask
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
                 " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
                 "{{ '<|im_start|>assistant\n' }}{% endif %}")
WORDS = ("the a model token draft target verify accept reject tree chain step layer head cache prompt reply "
         "question answer river mountain city history science music language number people water light "
         "time world energy system data train test small large fast slow first last").split()
ROWS = 48


def chat_rows(n: int = ROWS, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)

    def sentence(lo, hi):
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))).capitalize() + "."

    rows = []
    for i in range(n):
        prompt = " ".join(sentence(4, 12) for _ in range(rng.randint(1, 3))) + " Explain?"
        reply = " ".join(sentence(6, 14) for _ in range(rng.randint(2, 4)))
        rows.append({"prompt": prompt, "prompt_id": f"{i:064x}",
                     "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]})
    return rows


def tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIALS,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "<|pard|>"])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def qwen2(tok, hidden: int, layers: int, seed: int):
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=1,
                      max_position_embeddings=4096, tie_word_embeddings=False, use_sliding_window=False,
                      bos_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, dtype="float32")
    model = Qwen2ForCausalLM(cfg).eval()
    model.generation_config = GenerationConfig(bos_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id, do_sample=False)
    return model


def build(root: Path) -> None:
    import pandas as pd

    rows = chat_rows()
    tok = tokenizer([m["content"] for r in rows for m in r["messages"]])
    for name, hidden, layers, seed in (("qwen2-target", 128, 4, 0), ("qwen2-draft", 64, 2, 1)):
        out = root / name
        qwen2(tok, hidden, layers, seed).save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
    data = root / "ultrachat_200k" / "data"
    data.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(data / "train_sft-00000-of-00001.parquet")


if __name__ == "__main__":
    build(Path(sys.argv[1]))
