"""The peers: other engines' decoding, timed in our loop's jobs beside our arms, declared once:
which engine runs each, what it takes and loads. They are not methods of ours (no NAME: the
registry lists them apart, as PEERS); backends/hf_generate.py (Hugging Face `generate`) and
backends/vllm_peer.py (vLLM's offline engine) run them with the benchmark's prompts, records and
summary schema.

    engine    "hf": transformers' generate() on the job's own model; "vllm": a vLLM engine on the
              same checkpoint, dtype and threads, in the job's process; "llamacpp": a llama-server
              process on the same checkpoint converted to GGUF in the job's dtype, on the job's
              thread count (backends/llamacpp_peer.py)
    title     the engine as the tables name it
    options   the variant parameters a peer takes
    owner     the method whose checkpoint it loads (its `checkpoint` parameter), or None
    baseline  the peer of our baseline loop (plain greedy decoding)
    tool      a build directory the peer runs from, made by a rule of the workflow, which writes its
              manifest.json last (the job's input); the job gets it as the `build` parameter
"""
from __future__ import annotations

from dataclasses import dataclass

LLAMACPP_BUILD = "data/llama.cpp"   # rule llamacpp_build (workflow/rules/llamacpp.smk)


@dataclass(frozen=True)
class Peer:
    engine: str = "hf"
    title: str = "HF `generate`"
    options: frozenset = frozenset()
    owner: str | None = None
    baseline: bool = False
    default_draft_len: int | None = None   # the engine's own default for its draft length option
    draft_len_option: str | None = None
    tool: str | None = None

    def check(self, name: str, params: dict) -> None:
        """A variant's parameters: known options, and the checkpoint where the peer loads one."""
        allowed = self.options | ({"checkpoint"} if self.owner else set()) | ({"build"} if self.tool else set())
        unknown = sorted(set(params) - allowed)
        if unknown or (self.owner and "checkpoint" not in params):
            needs = f"needs checkpoint (a {self.owner} checkpoint), " if self.owner else ""
            raise ValueError(f"{name}: {needs}takes {sorted(self.options) or 'no parameters'}; got {sorted(params)}")

    def draft_shape(self, params: dict) -> str | None:
        """The draft it proposes, as the tables print it (None: no fixed shape)."""
        if self.draft_len_option is None:
            return None
        return f"chain k={params.get(self.draft_len_option, self.default_draft_len)}"


PEERS = {
    "hf_generate": Peer(baseline=True),
    # prompt lookup (prompt_lookup_num_tokens: generate()'s default is 10): the n-gram method's peer
    "hf_prompt_lookup": Peer(options=frozenset({"prompt_lookup_num_tokens", "max_matching_ngram_size"}),
                             draft_len_option="prompt_lookup_num_tokens", default_draft_len=10),
    # assisted generation with the same draft checkpoint: the draft model's peer
    "hf_assisted": Peer(options=frozenset({"num_assistant_tokens", "num_assistant_tokens_schedule",
                                           "assistant_confidence_threshold"}), owner="draft_model"),
    # vLLM's plain greedy decoding, one request at a time: our baseline loop's peer, paired in our
    # job (the vLLM jobs time vLLM against itself)
    "vllm_generate": Peer(engine="vllm", title="vLLM (offline engine, serial)", baseline=True,
                          options=frozenset({"kv_cache_memory_bytes"})),
    # llama.cpp's server (opt-in: workflow/configs/llamacpp.yaml builds it): its plain greedy
    # decoding, and its n-gram lookup (`--spec-type ngram-simple`: the draft is the m tokens that
    # followed the last earlier match of the current n-gram), our n-gram method's peer
    "llamacpp_generate": Peer(engine="llamacpp", title="llama.cpp (llama-server)", baseline=True,
                              options=frozenset({"poll"}), tool=LLAMACPP_BUILD),
    "llamacpp_lookup": Peer(engine="llamacpp", title="llama.cpp (llama-server)", tool=LLAMACPP_BUILD,
                            options=frozenset({"poll", "spec_type", "spec_ngram_simple_size_n",
                                               "spec_ngram_simple_size_m", "spec_ngram_simple_min_hits",
                                               "spec_draft_n_max", "spec_draft_n_min"}),
                            draft_len_option="spec_ngram_simple_size_m", default_draft_len=48),
}
