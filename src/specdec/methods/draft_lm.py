"""Standalone draft language models, shared by the draft-model and PARD methods: build, train,
save, load, open for decoding, export for vLLM.

A draft LM is an ordinary Hugging Face causal LM with the target's tokenizer and vocabulary size,
saved as a standalone checkpoint that vLLM loads directly. For the embedded default no smaller
pretrained model shares SmolLM2's tokenizer, so the draft is derived from the target: the same
architecture cut to `num_layers` decoder layers, each initialised from a chosen target layer,
with the target's embeddings, final norm and LM head. At full scale it starts from
`init_model_path` (the reference system's Qwen2.5-0.5B-Instruct), its vocabulary padded to the
target's.

Training is distillation on the target's greedy completions: the loss covers completion tokens
only. A method supplies its objective as `make_batch(seqs, step) -> DraftBatch` (input ids,
positions, an optional 4-D attention mask, labels); `draft_trainee` turns it into what the shared
training driver (train/driver.py) runs.

Checkpoint layout: the Hugging Face files (config.json, model.safetensors, tokenizer), plus
`specdec.json` (method, settings, target signature, training log, eval proxy) and
`manifest.json`, written last.
"""
from __future__ import annotations

import copy
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..data.records import write_json
from ..train.checkpoint import CheckpointMismatch, read_meta, target_signature
from ..train.hidden import Sequence
from ..train.soft import padded_soft, soft_cross_entropy

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "generation_config.json")
IGNORE = -100


@dataclass
class DraftLMConfig:
    num_layers: int = 4
    init_layers: list[int] | None = None   # target layers copied into the draft; None: evenly spaced
    init_model_path: str | None = None     # start from this pretrained model instead of the target
    train_embeddings: bool = False         # embeddings / LM head stay the target's unless set
    train_context: int | None = None       # prompt tokens kept before the completion in training
    init_checkpoint: str | None = None     # "method/name" of a configured checkpoint to start from;
                                           # the workflow resolves it into init_model_path


def default_init_layers(target_layers: int, num_layers: int) -> list[int]:
    """The target's first layers, as early-exit drafts do. On SmolLM2 (30 layers) every 4-layer
    subset starts far off (teacher-forced CE 14-28 nats), the first four least badly (4% top-1
    vs 0% for evenly spaced ones): training does the work either way."""
    return list(range(min(num_layers, target_layers)))


def derive_from_target(target, cfg: DraftLMConfig):
    """The target's architecture with cfg.num_layers layers copied from cfg.init_layers."""
    from transformers import AutoModelForCausalLM
    n = target.config.num_hidden_layers
    layers = cfg.init_layers or default_init_layers(n, cfg.num_layers)
    if len(layers) != cfg.num_layers or not all(0 <= i < n for i in layers):
        raise ValueError(f"draft init_layers {layers}: need {cfg.num_layers} target layer ids in 0..{n - 1}")
    dcfg = copy.deepcopy(target.config)
    dcfg.num_hidden_layers = cfg.num_layers
    if getattr(dcfg, "layer_types", None):
        dcfg.layer_types = [target.config.layer_types[i] for i in layers]
    draft = AutoModelForCausalLM.from_config(dcfg, dtype=torch.float32)
    src = target.state_dict()
    state = {}
    for k in draft.state_dict():
        if k.startswith("model.layers."):
            _, _, i, rest = k.split(".", 3)
            state[k] = src[f"model.layers.{layers[int(i)]}.{rest}"]
        else:
            state[k] = src[k]
    draft.load_state_dict(state)
    return draft, layers


def from_pretrained_init(path: str, target_config):
    """A pretrained draft base, its vocabulary padded to the target's (vLLM needs equal sizes)."""
    from transformers import AutoModelForCausalLM
    draft = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    have, want = draft.config.vocab_size, target_config.vocab_size
    if have > want:
        raise CheckpointMismatch(f"{path}: vocab_size {have} is larger than the target's {want}")
    if have < want:
        draft.resize_token_embeddings(want)
    return draft


# ---- training data -----------------------------------------------------------------------------
def clip_prompt(seq: Sequence, keep: int) -> Sequence:
    """Keep only the last `keep` prompt tokens (training cost scales with sequence length; the
    labels are all in the completion)."""
    return seq.clip(max(seq.prompt_len - keep, 0))


@dataclass
class DraftBatch:
    input_ids: torch.Tensor                  # (B, N)
    position_ids: torch.Tensor               # (B, N)
    labels: torch.Tensor                     # (B, N), IGNORE where no loss
    attention_mask: torch.Tensor | None = None   # (B, 1, N, N) additive, or None = causal
    position_of_label: torch.Tensor | None = None  # (B, N) draft position (1..K) of each label, 0 = none
    soft: tuple[torch.Tensor, torch.Tensor] | None = None  # (B, N, K) the target's top-K ids (-1: none), logp


def causal_batch(seqs: list[Sequence], pad_id: int) -> DraftBatch:
    """Next-token prediction of the target's labels at the completion's positions; right padding
    (causal attention never looks ahead, so no mask is needed)."""
    n = max(len(s.ids) for s in seqs)
    ids = torch.full((len(seqs), n), pad_id, dtype=torch.long)
    labels = torch.full((len(seqs), n), IGNORE, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, :len(s.ids)] = s.ids
        # position t predicts the target's token after ids[:t + 1] (labelled positions only)
        labels[b, :len(s.ids)] = torch.where(s.labels >= 0, s.labels, IGNORE)
    pos = torch.arange(n).expand(len(seqs), n)
    return DraftBatch(ids, pos, labels, None, (labels != IGNORE).long(), padded_soft(seqs, n, shifted=False))


def hidden_states(model, batch: DraftBatch, device) -> torch.Tensor:
    """The draft's last hidden states (B, N, H) for a batch (a bool mask becomes additive)."""
    mask = batch.attention_mask
    if mask is not None:
        dtype = next(model.parameters()).dtype
        mask = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, torch.finfo(dtype).min).to(device)
    out = model.model(input_ids=batch.input_ids.to(device), position_ids=batch.position_ids.to(device),
                      attention_mask=mask, use_cache=False)
    return out.last_hidden_state


def completion_lm_loss(model, batch: DraftBatch, device, max_pos: int = 1) -> tuple[torch.Tensor, dict]:
    """Mean CE over label positions; the LM head runs only at those positions. Also accuracy per
    draft position (1..max_pos)."""
    sel = batch.labels != IGNORE
    h = hidden_states(model, batch, device)[sel.to(device)]
    logits = model.lm_head(h).float()
    y = batch.labels[sel].to(device)
    if batch.soft is None:
        loss = F.cross_entropy(logits, y)
    else:   # the target's top-K distribution at each label (train/soft.py)
        loss = soft_cross_entropy(logits, batch.soft[0][sel].to(device), batch.soft[1][sel].to(device))
    right = logits.argmax(-1) == y
    where = batch.position_of_label[sel].to(device)
    metrics = {}
    for p in range(1, max_pos + 1):
        m = where == p
        if m.any():
            metrics[f"acc_pos{p}"] = right[m].float().mean().item()
    return loss, metrics


@torch.no_grad()
def eval_accuracy(model, seqs: list[Sequence], make_batch, device, max_pos: int, batch_size: int = 8) -> list[float]:
    """Teacher-forced top-1 accuracy per draft position over every example (no dropping)."""
    right = torch.zeros(max_pos)
    total = torch.zeros(max_pos)
    model.eval()
    for a in range(0, len(seqs), batch_size):
        batch = make_batch(seqs[a:a + batch_size], None)
        sel = batch.labels != IGNORE
        pred = model.lm_head(hidden_states(model, batch, device)[sel.to(device)]).argmax(-1).cpu()
        ok = pred == batch.labels[sel]
        where = batch.position_of_label[sel]
        for p in range(1, max_pos + 1):
            m = where == p
            right[p - 1] += ok[m].sum()
            total[p - 1] += m.sum()
    return (right / total.clamp(min=1)).tolist()


# ---- the training job -------------------------------------------------------------------------
def draft_trainee(method: str, target, data, settings: dict, tcfg, device: str, *, make_batch: Callable,
                  max_pos: int, method_config: dict, hf_config_extra: dict | None = None,
                  prepare: Callable | None = None):
    """The driver's Trainee for a draft LM trained with the method's objective.
    make_batch(seqs, step) builds a DraftBatch (step None: evaluation, nothing random);
    prepare(draft, train_seqs) may check the data or adapt the model before training."""
    from ..train.driver import Trainee
    dcfg = DraftLMConfig(**settings.get("draft", {}))
    if dcfg.init_checkpoint is not None:
        raise ValueError(f"draft.init_checkpoint {dcfg.init_checkpoint!r} must be resolved into init_model_path "
                         f"(the workflow does this)")
    fit_seqs = data.train if dcfg.train_context is None else [clip_prompt(s, dcfg.train_context) for s in data.train]
    if dcfg.init_model_path:
        draft, init = from_pretrained_init(dcfg.init_model_path, target.config), dcfg.init_model_path
    else:
        draft, init = derive_from_target(target, dcfg)
    if prepare is not None:
        prepare(draft, data.train)
    for name, p in draft.named_parameters():
        shared = name.startswith(("model.embed_tokens", "lm_head"))   # the target's, unless trained
        p.requires_grad_(dcfg.train_embeddings or not shared)
    draft.config.use_cache = True
    draft.to(device, getattr(torch, tcfg.dtype))

    def loss(module, idx, step):
        return completion_lm_loss(module, make_batch([fit_seqs[i] for i in idx], step), device, max_pos)

    def evaluate(module):
        return {name: {"top1_accuracy_per_position": eval_accuracy(module, seqs, make_batch, device, max_pos)}
                for name, seqs in data.eval_splits().items()}

    def save(out_dir, train_config, log, eval_proxy):
        for k, v in (hf_config_extra or {}).items():
            setattr(draft.config, k, v)
        config = {"draft": {**asdict(dcfg), "init_layers": init if isinstance(init, list) else None}, **method_config}
        save_draft_lm(draft.float(), out_dir, method, config, target, train_config, log, eval_proxy)

    n_params = sum(p.numel() for p in draft.model.layers.parameters())
    return Trainee(draft, len(data.train), loss, evaluate, save, {"draft": asdict(dcfg), **method_config},
                   f"draft of {draft.config.num_hidden_layers} layers ({n_params / 1e6:.1f}M layer parameters, "
                   f"init {init})")


def save_draft_lm(draft, out_dir: str, method: str, settings: dict, target, train_config: dict,
                  log: list[dict], eval_proxy: dict) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    draft.save_pretrained(out)
    target_dir = Path(target.name_or_path)
    for name in TOKENIZER_FILES:   # the target's tokenizer: the draft shares its vocabulary
        if (target_dir / name).is_file():
            shutil.copy(target_dir / name, out / name)
    write_json(out / "specdec.json", {
        "method": method, "config": settings, "target": target_signature(target.config),
        "train": train_config, "train_seconds": log[-1]["elapsed_s"], "eval_proxy": eval_proxy,
        "train_log": log})
    files = sorted(p.name for p in out.iterdir() if p.name not in ("manifest.json", "resume.pt"))
    write_json(out / "manifest.json", {"method": method, "files": files})


def load_draft_lm(ckpt_dir: str, method: str, target_config, dtype=torch.float32, device="cpu"):
    """-> (specdec.json contents, model); refuses another method's checkpoint or another vocabulary."""
    from transformers import AutoConfig, AutoModelForCausalLM
    d = Path(ckpt_dir)
    meta = read_meta(ckpt_dir, method, "specdec.json", ("manifest.json", "specdec.json", "config.json"))
    vocab = AutoConfig.from_pretrained(d).vocab_size
    if vocab != target_config.vocab_size:
        raise CheckpointMismatch(f"{d}/config.json: vocab_size is {vocab} but the target model's vocab_size "
                                 f"is {target_config.vocab_size}: a draft must share the target's vocabulary")
    model = AutoModelForCausalLM.from_pretrained(d, dtype=dtype).to(device).eval()
    return meta, model


def open_draft(ckpt_dir: str, method: str, target, draft_len: int):
    """A proposer's draft LM: (specdec.json, the model wrapped in the core's cache interface, so
    the draft keeps its own KV cache), in the target's dtype and device."""
    from ..core.target import TargetModel
    if draft_len < 1:
        raise ValueError(f"{method}: draft_len must be >= 1, got {draft_len}")
    meta, model = load_draft_lm(ckpt_dir, method, target.config, target.dtype, target.device)
    return meta, TargetModel(model)


def export_hf_draft(ckpt_dir: str, method: str, target_dir: str, out_dir: str, require: tuple[str, ...] = ()) -> dict:
    """The directory vLLM loads as `speculative_config.model`: the draft's Hugging Face files
    (config, weights, tokenizer) without our metadata, after the same checks as loading; the
    draft's config.json must have the `require`d fields."""
    from transformers import AutoConfig
    meta, model = load_draft_lm(ckpt_dir, method, AutoConfig.from_pretrained(target_dir))
    missing = [k for k in require if getattr(model.config, k, None) is None]
    if missing:
        raise ValueError(f"{ckpt_dir}/config.json: no {', '.join(missing)} (vLLM's {method} needs it)")
    src, out = Path(ckpt_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = [p.name for p in sorted(src.iterdir())
             if p.is_file() and p.name not in ("specdec.json", "manifest.json", "resume.pt")]
    for name in files:
        shutil.copy(src / name, out / name)
    write_json(out / "manifest.json", {"method": method, "source": str(ckpt_dir), "files": files})
    return meta
