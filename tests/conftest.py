import os
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from dag import ClusterUnavailable, copy_workflow, run_smoke_local, run_smoke_slurm, slurm_down, slurm_up

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


def distillation_set(model, root, taps, n_records=24, token_hi=64, completion=24, soft_topk=0):
    """A tiny target saved under root/target, a distillation set of its own greedy completions
    (train.jsonl; heldout.jsonl = its first 4 records) and the hidden-state artifact with `taps`
    (and `soft_topk` soft labels)."""
    import random

    from specdec.core.loop import decode
    from specdec.core.target import TargetModel
    from specdec.data.records import write_jsonl
    from specdec.train.hidden import write_hidden_states

    target_dir = root / "target"
    model.save_pretrained(target_dir)
    rng = random.Random(0)
    records = []
    for i in range(n_records):
        prompt = [rng.randrange(3, token_hi) for _ in range(rng.randint(4, 12))]
        with torch.inference_mode():
            completion_ids = decode(TargetModel(model), prompt, completion, set()).output_ids
        records.append({"id": f"r{i}", "prompt": "", "prompt_ids": prompt, "completion_ids": completion_ids})
    write_jsonl(root / "train.jsonl", records)
    write_jsonl(root / "heldout.jsonl", records[:4])
    hidden = root / "hidden.safetensors"
    write_hidden_states(str(target_dir), {"train": str(root / "train.jsonl"), "heldout": str(root / "heldout.jsonl")},
                        list(taps), str(hidden), dtype="float32", soft_topk=soft_topk)
    return {"model": model, "root": root, "target_dir": target_dir, "hidden": hidden, "records": records}


def check_against_fresh_proposer(model, method: str, params: dict, records, compare, max_new_tokens=24):
    """Decode `records` with a proposer whose every propose() is checked against a fresh proposer
    that prefilled the verified sequence in one go: `compare(prop, fresh, ids, draft, fresh_draft)`
    asserts they agree. Returns (checks made, accepted counts seen)."""
    from specdec.core.loop import decode
    from specdec.core.target import TargetModel
    from specdec.methods import build_proposer

    target = TargetModel(model)
    prop = build_proposer(method, params, target)
    checked, outcomes = 0, set()
    original = prop.propose

    def checked_propose(ids, max_depth=None):
        nonlocal checked
        draft = original(ids, max_depth)
        fresh_target = TargetModel(model)
        fresh = build_proposer(method, params, fresh_target)
        if fresh.drafts_from_prompt:
            fresh.start(ids, None)   # its first propose() gets the prompt itself, last token pending
        else:
            _, hidden = fresh_target.prefill(ids[:-1], fresh.tap_layers)
            fresh.start(ids[:-1], hidden)
        compare(prop, fresh, ids, draft, fresh.propose(ids, max_depth))
        checked += 1
        return draft

    prop.propose = checked_propose
    for rec in records:
        with torch.inference_mode():
            outcomes.update(decode(target, rec["prompt_ids"], max_new_tokens, set(), prop).accepted)
    return checked, outcomes


def save_word_tokenizer(path, vocab_size=VOCAB):
    """A word-level tokenizer for a tiny target: token i is the word `w{i}` (0: <unk>, 2: </s>),
    saved beside the model so that text goes in and comes out (no chat template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size)} | {"<unk>": 0, "</s>": 2}
    del vocab["w0"], vocab["w2"]
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>").save_pretrained(path)



@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    """A tiny random Llama with a word-level tokenizer, saved once per test module (EOS: token 2)."""
    path = tmp_path_factory.mktemp("ckpt")
    model = tiny_llama()
    model.generation_config.eos_token_id = 2
    model.save_pretrained(path)
    save_word_tokenizer(path)
    return path

@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """With SPECDEC_SLURM=1, a single-node SLURM cluster for the session
    (tests/cluster/slurm_up.sh; root and Debian's packages: see docs/full-scale.md), through which
    the smoke DAG runs; a cluster that cannot come up is then an error. Otherwise state is None
    and `why` says so: the smoke DAG runs with the local executor and tests/test_slurm.py skips.
    (.ci/run installs the packages and sets SPECDEC_SLURM=1; a plain `pytest` on a workstation
    does not start daemons or write /etc/slurm.)"""
    if os.environ.get("SPECDEC_SLURM") != "1":
        yield SimpleNamespace(state=None, why="SPECDEC_SLURM is not 1: the SLURM tests run in .ci/run, "
                                              "or with SPECDEC_SLURM=1 (root, Debian's slurm packages)")
        return
    state = tmp_path_factory.mktemp("slurm-state")
    try:
        slurm_up(state)
    except ClusterUnavailable as why:
        pytest.fail(f"SPECDEC_SLURM=1, and {why}")
    yield SimpleNamespace(state=state, why=None)
    slurm_down(state)


@pytest.fixture(scope="session")
def smoke_run(slurm_cluster, tmp_path_factory):
    """The smoke DAG (results/tables.md and results/learning_curve.md), finished, in a scratch
    copy of the workflow; every job appends the project files it loaded to modules.jsonl
    (cli.log_loaded_modules). Through the SLURM cluster where one runs (with two faults and their
    recovery, tests/dag.py: run_smoke_slurm), else with the local executor on two cores."""
    wd = copy_workflow(tmp_path_factory.mktemp("smoke"))
    env = {"SPECDEC_MODULES_LOG": str(wd / "modules.jsonl")}
    if slurm_cluster.state:
        run_smoke_slurm(wd, env)
    else:
        run_smoke_local(wd, env)
    return wd
