"""Generate text with a speculative method: the benchmarks' decode loop (core/loop.py) on your
prompt, with the acceptance and speed of the run.

    from specdec.generate import Generator
    gen = Generator.load("checkpoints/smollm2-135m-instruct", "eagle3",
                         {"checkpoint": "checkpoints/eagle3/ttt5", "draft_len": 6, "tree_topk": 3,
                          "max_tree_nodes": 10})
    result = gen.generate("Why is the sky blue?", max_new_tokens=64)
    print(result.text, result.stats["tau"], result.stats["tokens_per_s"])

Greedy by default, so the text is the target's own greedy continuation whatever the method: the
method changes only how fast it comes. With `sampling=Sampling(temperature=0.7, seed=1)` the
text is a sample from the target's distribution, again whatever the method (core/verify.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .core.loop import decode
from .core.metrics import acceptance_stats
from .core.sampling import Sampling
from .core.target import TargetModel


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    stats: dict   # new_tokens, wall_s, tokens_per_s, steps, acceptance_rate, tau, ...


class Generator:
    """A target and (optionally) a method's proposer, ready to generate."""

    def __init__(self, model, tokenizer, method: str | None = None, params: dict | None = None):
        from . import methods
        from .models import eos_token_ids
        self.model, self.tokenizer = model, tokenizer
        self.target = TargetModel(model)
        self.method = method
        self.proposer = None if method is None else methods.build_proposer(method, params or {}, self.target)
        self.eos = eos_token_ids(model, tokenizer)

    @classmethod
    def load(cls, target_dir: str, method: str | None = None, params: dict | None = None,
             dtype: str = "auto", device: str = "cpu") -> Generator:
        """`dtype` auto: the host's speed dtype (specdec.host); float32 decodes exactly."""
        from .host import dtype_record
        from .models import load_causal_lm, load_tokenizer
        model = load_causal_lm(target_dir, dtype_record(dtype, device)["dtype"], device)
        return cls(model, load_tokenizer(target_dir), method, params)

    def prompt_ids(self, prompt: str, chat: bool = True) -> list[int]:
        """The prompt in the target's chat template (as the benchmark sets are), or as raw text."""
        if chat and getattr(self.tokenizer, "chat_template", None):
            from .data.wiki import chat_ids
            return chat_ids(self.tokenizer, prompt)
        return self.tokenizer.encode(prompt, add_special_tokens=False)

    def generate(self, prompt: str | list[int], max_new_tokens: int = 128, chat: bool = True,
                 stream: Callable[[str], None] | None = None, sampling: Sampling | None = None) -> Generation:
        """Continuation of `prompt` (text, or token ids as they are): greedy, or sampled with
        `sampling`. `stream` gets the new text piece by piece as the steps emit it."""
        ids = list(prompt) if isinstance(prompt, list) else self.prompt_ids(prompt, chat)
        new: list[int] = []
        shown = [""]

        def on_tokens(tokens):
            new.extend(tokens)
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            if len(text) > len(shown[0]):
                stream(text[len(shown[0]):])
                shown[0] = text

        result = decode(self.target, ids, max_new_tokens, self.eos, self.proposer,
                        on_tokens if stream is not None else None, sampling)
        stats = {"method": self.method or "baseline", "prompt_tokens": len(ids),
                 "new_tokens": len(result.output_ids), "wall_s": result.wall_s,
                 "tokens_per_s": len(result.output_ids) / result.wall_s if result.wall_s else None,
                 **acceptance_stats(result.drafted, result.accepted, result.depth)}
        text = self.tokenizer.decode(result.output_ids, skip_special_tokens=True)
        return Generation(text, result.output_ids, stats)
