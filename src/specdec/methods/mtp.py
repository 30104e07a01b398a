"""DeepSeek-V3-style multi-token prediction (MTP) modules on the frozen target, in the layout of
vLLM's MiMo MTP (`model.mtp_layers.{k}.*`, see vllm/model_executor/models/mimo_mtp.py).

Module k (1..K) at position j reads the previous state and the embedding of the token k ahead:
    g_j^k = final_norm( Block( input_proj[ hidden_norm(g_j^(k-1)) ; token_norm(E x_(j+k)) ] ) )
with g^0 = the target's last hidden state (pre-norm, as vLLM's MiMo target hands it over), Block
one decoder layer of the target's own architecture, and the target's LM head predicting
x_(j+k+1) from g_j^k. The embedding at position 0 is zeroed, as in vLLM. Training: CE on the
target's greedy completion tokens (distillation), averaged over modules.

DeepSeek-V3 trains its MTP modules with the model; here they are added to a frozen target, so
they start from its parts: Block from its last layer, final_norm from its final norm, and
input_proj = [s I | 0], so that the module first reads s * hidden_norm(g), the previous state
back at the residual stream's typical RMS s (which hidden_norm divided out, and the copied
Block's weights expect), and the token half starts at zero. With nn.Linear's random input_proj
the first loss is about ln(vocab): the module starts from nothing.

Inference keeps each module's KV cache equal to what a from-scratch run over the verified
sequence would hold. Module k is exact at positions j <= n-1-k (n tokens incl. the pending one):
after each verification step, every newly verified position of every module is written in ONE
forward per module (a chunk, not a token-by-token loop); the positions that depend on draft
tokens are computed for the draft, then cropped from the cache.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..core.loop import Draft, StepResult
from ..core.target import new_cache, one_layer_config
from ..core.tree import tree_attention_inputs
from ..train.checkpoint import load_proposer, save_trained, write_model_dir
from ..train.driver import frozen_target
from ..train.soft import padded_soft, soft_cross_entropy
from . import VllmServing

NAME = "mtp"


class MTPLayer(nn.Module):
    def __init__(self, config, block_cls, norm_cls):
        super().__init__()
        h = config.hidden_size
        self.token_layernorm = norm_cls(h, eps=config.rms_norm_eps)
        self.hidden_layernorm = norm_cls(h, eps=config.rms_norm_eps)
        self.input_proj = nn.Linear(2 * h, h, bias=False)
        self.block = block_cls(config, layer_idx=0)
        self.final_layernorm = norm_cls(h, eps=config.rms_norm_eps)

    def forward(self, prev, emb, position_ids, position_embeddings, attention_mask=None, cache=None):
        emb = torch.where(position_ids[..., None] == 0, 0, emb)  # vLLM masks position 0
        x = self.input_proj(torch.cat([self.hidden_layernorm(prev), self.token_layernorm(emb)], dim=-1))
        x = self.block(x, attention_mask=attention_mask, position_ids=position_ids,
                       past_key_values=cache, use_cache=cache is not None,
                       position_embeddings=position_embeddings)
        return self.final_layernorm(x)


class MTP(nn.Module):
    """K modules. The embedding, rotary embedding and LM head are the target's (not stored)."""

    def __init__(self, config, num_modules: int, block_cls, norm_cls):
        super().__init__()
        self.layer_config = one_layer_config(config)
        self.layers = nn.ModuleList(MTPLayer(self.layer_config, block_cls, norm_cls) for _ in range(num_modules))

    @classmethod
    def for_target(cls, model, num_modules: int) -> MTP:
        base = model.model
        return cls(model.config, num_modules, type(base.layers[0]), type(base.norm))

    def init_from_target(self, model, state_rms: float | None) -> None:
        """Block from the target's last decoder layer, final norm from the target's final norm;
        input_proj = [state_rms I | 0] (None: nn.Linear's random init)."""
        H = model.config.hidden_size
        for layer in self.layers:
            layer.block.load_state_dict(model.model.layers[-1].state_dict())
            layer.final_layernorm.load_state_dict(model.model.norm.state_dict())
            if state_rms is not None:
                with torch.no_grad():
                    layer.input_proj.weight.zero_()
                    layer.input_proj.weight[:, :H] = state_rms * torch.eye(H)   # x = s * hidden_norm(g)


# ---- training ---------------------------------------------------------------------------------
@dataclass
class MTPTrainConfig:
    num_modules: int = 1
    # input_proj's start: "residual", [s I | 0] with s the median RMS of g^0 over the first
    # training sequences (see the module docstring); "random": nn.Linear's default init
    input_init: str = "residual"


def state_rms(seqs, tap: int, sample: int = 64) -> float:
    """The median per-token RMS of tap `tap` over the first `sample` sequences."""
    h = torch.cat([s.taps[tap].float() for s in seqs[:sample]])
    return h.pow(2).mean(-1).sqrt().median().item()


def pad_batch(seqs, tap: int, dtype=torch.float32):
    n = max(len(s.ids) for s in seqs)
    ids = torch.zeros(len(seqs), n, dtype=torch.long)
    h = torch.zeros(len(seqs), n, seqs[0].taps[tap].shape[-1], dtype=dtype)
    targets = torch.full((len(seqs), n), -1, dtype=torch.long)   # Sequence.targets, padded
    for b, s in enumerate(seqs):
        ids[b, :len(s.ids)] = s.ids
        h[b, :len(s.ids)] = s.taps[tap].to(dtype)
        targets[b, :len(s.ids)] = s.targets
    return ids, h, targets, padded_soft(seqs, n)


def mtp_forward_train(mtp: MTP, model, ids, h, targets, soft=None):
    """Every module over whole padded sequences (causal attention, no cache).
    Returns per module (logits of labelled positions, labels, their soft labels or None)."""
    base = model.model
    n = ids.shape[1]
    prev, out = h, []
    for k, layer in enumerate(mtp.layers, start=1):
        m = n - k                                   # module k runs positions 0..n-k-1
        pos = torch.arange(m, device=ids.device)[None].expand(len(ids), -1)
        g = layer(prev[:, :m], base.embed_tokens(ids[:, k:]), pos, base.rotary_emb(prev, pos))
        y = targets[:, k + 1:]                      # label of position j is x_(j+k+1)
        ok = y >= 0
        ys = None if soft is None else (soft[0][:, k + 1:][ok], soft[1][:, k + 1:][ok])
        out.append((model.lm_head(g[:, :m - 1][ok]), y[ok], ys))
        prev = g
    return out


TRAIN_SETTINGS = {"mtp": MTPTrainConfig}


def hidden_taps(config, settings: dict) -> list[int]:
    return [config.num_hidden_layers]   # g^0: the target's last (pre-norm) hidden state


def setup(target, data, settings: dict, tcfg, device: str):
    """Examples are sequences; the modules start from the target's parts (module docstring)."""
    from ..train.driver import Trainee
    mcfg = MTPTrainConfig(**settings.get("mtp", {}))
    if mcfg.input_init not in ("residual", "random"):
        raise ValueError(f"mtp.input_init: {mcfg.input_init!r} is not one of residual, random")
    dtype = getattr(torch, tcfg.dtype)
    model = frozen_target(target, tcfg.dtype, device)   # the frozen embedding, rotary embedding and LM head
    tap = model.config.num_hidden_layers
    mtp = MTP.for_target(model, mcfg.num_modules)
    rms = state_rms(data.train, tap) if mcfg.input_init == "residual" else None
    mtp.init_from_target(model, rms)
    mtp.to(device, dtype)

    def batch_of(seqs):
        ids, h, targets, soft = pad_batch(seqs, tap, dtype)
        return ids.to(device), h.to(device), targets.to(device), None if soft is None else [t.to(device) for t in soft]

    def loss(module, idx, step):
        outs = mtp_forward_train(module, model, *batch_of([data.train[i] for i in idx]))
        losses = [F.cross_entropy(lg.float(), y) if soft is None else soft_cross_entropy(lg, *soft)
                  for lg, y, soft in outs]
        metrics = {f"acc_module{k + 1}": (lg.argmax(-1) == y).float().mean().item()
                   for k, (lg, y, _) in enumerate(outs)}
        return sum(losses) / len(losses), metrics

    def evaluate(module):   # teacher-forced top-1 accuracy per module
        proxy = {}
        for name, seqs in data.eval_splits().items():
            hits = [[0, 0] for _ in module.layers]
            for a in range(0, len(seqs), tcfg.batch_size):
                for k, (lg, y, _) in enumerate(mtp_forward_train(module, model,
                                                                 *batch_of(seqs[a:a + tcfg.batch_size]))):
                    hits[k][0] += (lg.argmax(-1) == y).sum().item()
                    hits[k][1] += len(y)
            proxy[name] = {"accuracy_per_module": [h / max(1, c) for h, c in hits]}
        return proxy

    def save(out_dir, train_config, log, eval_proxy):
        save_trained(out_dir, NAME, asdict(mcfg), {k: v.float() for k, v in mtp.state_dict().items()},
                     model.config, train_config, log, eval_proxy)

    start = "random" if rms is None else f"[{rms:.2f} I | 0] (g^0's median RMS)"
    return Trainee(mtp, len(data.train), loss, evaluate, save, asdict(mcfg),
                   f"{mcfg.num_modules} module(s), input_proj {start}")


def load_module(ckpt_dir: str, model) -> MTP:
    meta, state = load_proposer(ckpt_dir, NAME, model.config)
    mtp = MTP.for_target(model, meta["config"]["num_modules"])
    mtp.load_state_dict(state)
    return mtp


# ---- inference --------------------------------------------------------------------------------
@dataclass
class MTPConfig:
    checkpoint: str
    num_speculative_steps: int | None = None  # draft tokens per step; default: one per module


class MTPProposer:
    drafts_from_prompt = False  # drafts from the target's hidden states: needs the prefill first

    def __init__(self, cfg: MTPConfig, target):
        model = target.model
        self.mtp = load_module(cfg.checkpoint, model).to(target.device, target.dtype).eval()
        K = len(self.mtp.layers)
        self.steps = cfg.num_speculative_steps or K
        if not 1 <= self.steps <= K:
            raise ValueError(f"mtp: num_speculative_steps {self.steps} needs 1..{K} modules "
                             f"(checkpoint {cfg.checkpoint})")
        self.base, self.lm_head = model.model, model.lm_head
        self.dtype, self.device = target.dtype, target.device
        self.tap_layers = (target.num_layers,)
        self.draft_shape = f"chain {self.steps} (MTP modules)"

    def start(self, prompt_ids, hidden, sampler=None) -> None:
        self.sampler = sampler
        self.caches = [new_cache(self.mtp.layer_config) for _ in range(self.steps)]
        self.committed = [0] * self.steps               # exact positions in each module's cache
        self.queue = [hidden[self.tap_layers[0]]] + [None] * (self.steps - 1)  # verified inputs not yet run

    def observe(self, step: StepResult) -> None:
        # the target's states of [old pending, *accepted]: module 1's inputs for those positions
        self.queue[0] = torch.cat([self.queue[0], step.hidden[self.tap_layers[0]]])

    def _run(self, k: int, rows: torch.Tensor, tokens: list[int]) -> torch.Tensor:
        c = self.committed[k]
        mask, pos = tree_attention_inputs(list(range(-1, len(tokens) - 1)), c, self.dtype, self.device)
        emb = self.base.embed_tokens(torch.tensor([tokens], device=self.device))
        return self.mtp.layers[k](rows[None], emb, pos, self.base.rotary_emb(emb, pos), mask, self.caches[k])[0]

    def propose(self, ids: list[int], max_depth: int | None = None) -> Draft:
        # always every module (their caches advance together); the loop prunes past max_depth
        n = len(ids)                  # positions 0..n-1; n-1 is the pending token
        seq = list(ids)
        spec = None                   # outputs of the previous module at draft-dependent positions
        qs = []                       # T > 0: the distribution each draft token was drawn from
        for k in range(self.steps):   # module k+1 at position j reads token j+k+1, predicts j+k+2
            c, exact = self.committed[k], self.queue[k]
            rows = exact if spec is None else torch.cat([exact, spec])  # inputs of positions c..n-2
            out = self._run(k, rows, seq[c + k + 1: n + k])
            logits = self.lm_head(out[-1])                    # draft token n+k, from position n-2
            if self.sampler is None:
                seq.append(int(logits.argmax()))
            else:
                token, q = self.sampler.sample(logits)
                seq.append(int(token))
                qs.append(q)
            # this module is draft-free at positions j <= n-2-k: keep those, crop the rest
            keep = n - 1 - k - c
            if keep < len(rows):
                self.caches[k].crop(keep - len(rows))  # negative: drop that many from the end
            self.committed[k] = c + keep
            self.queue[k] = exact[keep:]  # exact inputs of the cropped positions: rerun next step
            if k + 1 < self.steps:
                # the next module's inputs: exact up to n-2-k, the rest depends on this step's drafts
                done = out[:keep]
                self.queue[k + 1] = done if self.queue[k + 1] is None else torch.cat([self.queue[k + 1], done])
                spec = out[keep:]
        return Draft.chain(seq[n:], torch.stack(qs) if qs else None)


PARAMS = MTPConfig
EXAMPLE = {"params": {},
           "train": {"train": {"steps": 6, "batch_size": 4, "save_every": 3}, "mtp": {"num_modules": 2}}}


def build(params: dict, target) -> MTPProposer:
    return MTPProposer(MTPConfig(**params), target)


# ---- vLLM ---------------------------------------------------------------------------------------
VLLM = VllmServing(export="model")


def vllm_config(p: MTPConfig, export_dir: str | None) -> dict:
    # the served model is the MiMo export (target + MTP layers); vLLM runs its MTP layer 0 per step
    return {"method": "mtp", "num_speculative_tokens": p.num_speculative_steps or 1}


def export_vllm(ckpt_dir: str, target_dir: str, out_dir: str) -> None:
    """Write vLLM's MiMo MTP layout (vllm/model_executor/models/mimo_mtp.py): the target
    re-expressed as Qwen2 (a Llama target gets zero q/k/v biases, which changes nothing), an
    explicit `lm_head.weight` (the MTP loader keeps only `mtp_layers`, `embed_tokens`, `lm_head`),
    and module k under `model.mtp_layers.k.*` without the `block.` wrapper. Config: model_type
    qwen2, architectures [MiMoForCausalLM], num_nextn_predict_layers = K. vLLM then serves the
    directory as the target and, with speculative_config {"method": "mtp"}, as its drafter."""
    import glob
    from pathlib import Path

    from safetensors.torch import load_file
    from transformers import AutoConfig, Qwen2Config

    tcfg = AutoConfig.from_pretrained(target_dir)
    if tcfg.model_type not in ("llama", "qwen2"):
        raise ValueError(f"{target_dir}: MiMo MTP export supports llama and qwen2 targets, not {tcfg.model_type}")
    head_dim = getattr(tcfg, "head_dim", None) or tcfg.hidden_size // tcfg.num_attention_heads
    if tcfg.model_type == "llama" and (getattr(tcfg, "mlp_bias", False)
                                       or head_dim * tcfg.num_attention_heads != tcfg.hidden_size):
        raise ValueError(f"{target_dir}: this Llama (mlp_bias or head_dim != hidden/heads) has no Qwen2 equivalent")
    meta, state = load_proposer(ckpt_dir, NAME, tcfg)
    K = meta["config"]["num_modules"]
    weights = {}
    for shard in sorted(glob.glob(str(Path(target_dir) / "*.safetensors"))):
        weights.update(load_file(shard))
    dtype = weights["model.embed_tokens.weight"].dtype
    weights.setdefault("lm_head.weight", weights["model.embed_tokens.weight"].clone())
    biases = {"q_proj": tcfg.num_attention_heads * head_dim, "k_proj": tcfg.num_key_value_heads * head_dim,
              "v_proj": tcfg.num_key_value_heads * head_dim}

    def zero_biases(prefix):
        for proj, n in biases.items():
            weights.setdefault(f"{prefix}.self_attn.{proj}.bias", torch.zeros(n, dtype=dtype))

    for i in range(tcfg.num_hidden_layers):
        zero_biases(f"model.layers.{i}")
    for k in range(K):
        for name, value in state.items():
            if name.startswith(f"layers.{k}."):
                rest = name[len(f"layers.{k}."):].removeprefix("block.")
                weights[f"model.mtp_layers.{k}.{rest}"] = value.to(dtype)
        zero_biases(f"model.mtp_layers.{k}")

    qwen = Qwen2Config(
        vocab_size=tcfg.vocab_size, hidden_size=tcfg.hidden_size, intermediate_size=tcfg.intermediate_size,
        num_hidden_layers=tcfg.num_hidden_layers, num_attention_heads=tcfg.num_attention_heads,
        num_key_value_heads=tcfg.num_key_value_heads, hidden_act=tcfg.hidden_act,
        max_position_embeddings=tcfg.max_position_embeddings, rms_norm_eps=tcfg.rms_norm_eps,
        rope_parameters=dict(tcfg.rope_parameters), tie_word_embeddings=False, use_sliding_window=False,
        bos_token_id=tcfg.bos_token_id, eos_token_id=tcfg.eos_token_id,
        pad_token_id=getattr(tcfg, "pad_token_id", None))
    config = qwen.to_dict()
    config.update(architectures=["MiMoForCausalLM"], num_nextn_predict_layers=K,
                  dtype=str(dtype).removeprefix("torch."))

    write_model_dir(out_dir, weights, config,
                    {"method": NAME, "export": "vllm MiMoForCausalLM", "checkpoint": str(ckpt_dir),
                     "target": str(target_dir), "num_nextn_predict_layers": K},
                    copy_from=target_dir,
                    copy_names=("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                "generation_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"))
