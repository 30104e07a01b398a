"""UltraChat first user turns (full-scale config: HuggingFaceH4/ultrachat_200k from the hub)."""
from __future__ import annotations


def first_user_turns(rows):
    """(id, first user message, the assistant's reply to it or None) from rows with a `messages`
    list (ultrachat_200k's layout)."""
    for i, row in enumerate(rows):
        msgs = row.get("messages") or []
        if msgs and msgs[0].get("role") == "user" and isinstance(msgs[0].get("content"), str):
            answered = (len(msgs) >= 2 and msgs[1].get("role") == "assistant"
                        and isinstance(msgs[1].get("content"), str))
            yield str(row.get("prompt_id", i)), msgs[0]["content"], msgs[1]["content"] if answered else None


def load_rows(dataset: str, split: str):  # pragma: no cover - needs the hub
    from datasets import load_dataset
    return load_dataset(dataset, split=split)
