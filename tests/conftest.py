import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

VOCAB = 64


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(cfg).eval()


def tiny_qwen2(seed=0):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      use_sliding_window=False, bos_token_id=1, eos_token_id=2)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture(params=["llama", "qwen2"])
def tiny_model(request):
    torch.set_num_threads(1)
    return tiny_llama() if request.param == "llama" else tiny_qwen2()
