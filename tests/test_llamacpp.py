"""The opt-in llama.cpp peer (backends/llamacpp_peer.py, methods/peers.py). The options and the
plan run everywhere; the decoding tests need a llama.cpp build (rule llamacpp_build: data/llama.cpp,
or SPECDEC_LLAMACPP) and SmolLM2's tokenizer (the target checkpoint of the default DAG, or
SPECDEC_TOKENIZER), which llama.cpp's converter recognises; without them they are skipped, saying
which is missing."""
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from specdec.backends.llamacpp_peer import llamacpp_runner, server_args
from specdec.core.loop import decode
from specdec.core.target import TargetModel
from specdec.methods.peers import PEERS

ROOT = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("SPECDEC_LLAMACPP", ROOT / "data" / "llama.cpp"))
TOKENIZER = Path(os.environ.get("SPECDEC_TOKENIZER", ROOT / "checkpoints" / "smollm2-135m-instruct"))


def test_variant_parameters_become_server_options():
    assert server_args({}) == ["--poll", "0"]
    assert server_args({"poll": 50, "spec_type": "ngram-simple", "spec_ngram_simple_size_n": 2,
                        "spec_ngram_simple_size_m": 5}) == [
        "--poll", "50", "--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "5",
        "--spec-ngram-simple-size-n", "2"]


def test_a_peer_takes_its_options_and_the_build_only():
    PEERS["llamacpp_lookup"].check("llamacpp_lookup", {"build": "x", "spec_ngram_simple_size_m": 5})
    with pytest.raises(ValueError, match="takes"):
        PEERS["llamacpp_generate"].check("llamacpp_generate", {"spec_type": "ngram-simple"})
    with pytest.raises(ValueError, match="takes"):
        PEERS["vllm_generate"].check("vllm_generate", {"build": "x"})
    assert PEERS["llamacpp_lookup"].draft_shape({"spec_ngram_simple_size_m": 5}) == "chain k=5"


@pytest.fixture(scope="module")
def smol_shaped(tmp_path_factory):
    """A random 2-layer Llama with SmolLM2's tokenizer and vocabulary, saved in fp32."""
    missing = [f"{what} ({p})" for what, p in (("a llama.cpp build", BUILD / "manifest.json"),
                                               ("SmolLM2's tokenizer", TOKENIZER / "tokenizer.json"))
               if not p.exists()]
    if missing:
        pytest.skip(f"needs {' and '.join(missing)}")
    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      initializer_range=0.5)   # wide logits: no near ties between the two engines' fp32 sums
    model = LlamaForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("smol_shaped")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path, model, tok


@pytest.mark.parametrize("method, params", [("llamacpp_generate", {}),
                                            ("llamacpp_lookup", {"spec_type": "ngram-simple",
                                                                 "spec_ngram_simple_size_n": 1,
                                                                 "spec_ngram_simple_size_m": 4})])
def test_llamacpp_decodes_our_checkpoint_as_our_loop_does(smol_shaped, tmp_path, method, params):
    """In fp32, llama.cpp's greedy decoding of the converted checkpoint (plain, and verified n-gram
    lookup) emits our loop's tokens: the peer times the same computation on the same weights."""
    path, model, tok = smol_shaped
    torch.set_num_threads(1)
    prompt = tok("The quick brown fox jumps over the lazy dog. The quick brown")["input_ids"]
    ours = decode(TargetModel(model, pack=False), prompt, 24, set()).output_ids
    run, server = llamacpp_runner(str(BUILD), str(path), torch.float32, 1, 256, params, workdir=tmp_path)
    try:
        res = run(prompt, 0, 24)
    finally:
        server.close()
    assert server.proc.poll() is not None   # closed: the process has ended
    assert res.output_ids == ours
    assert res.wall_s > 0 and res.ttft_s is not None
