import json
import os

import pytest

from specdec.data.records import RecordError, read_jsonl, read_prompts, write_jsonl
from specdec.data.sharegpt import first_human_turns


def test_malformed_line_names_file_and_line(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"id": "a", "prompt": "p", "prompt_ids": [1]}\n\n{"id": "b", oops}\n')
    with pytest.raises(RecordError, match=rf"{p}: line 3: malformed JSON"):
        read_jsonl(p)


def test_missing_field_and_bad_ids(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"id": "a", "prompt": "p"}\n')
    with pytest.raises(RecordError, match="line 1: missing field.*prompt_ids"):
        read_prompts(p)
    p.write_text('{"id": "a", "prompt": "p", "prompt_ids": ["x"]}\n')
    with pytest.raises(RecordError, match="prompt_ids"):
        read_prompts(p)
    with pytest.raises(RecordError, match="file not found"):
        read_jsonl(tmp_path / "nope.jsonl")


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    p = tmp_path / "out.jsonl"
    write_jsonl(p, [{"a": 1}])

    def bad():
        yield {"a": 2}
        raise KeyboardInterrupt  # an interrupted run

    with pytest.raises(KeyboardInterrupt):
        write_jsonl(p, bad())
    assert read_jsonl(p) == [{"a": 1}]  # the old file is untouched
    assert os.listdir(tmp_path) == ["out.jsonl"]  # and no temporary file is left


def test_sharegpt_truncated_file_recovers_complete_records():
    recs = [{"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
            {"id": "b", "conversations": [{"from": "gpt", "value": "starts with gpt"}]},
            {"id": "c", "conversations": [{"from": "human", "value": "second"}]}]
    text = json.dumps(recs, indent=2)
    cut = text[: text.index('"second"') + 3]  # truncated inside the last record
    assert list(first_human_turns(text)) == [("a", "hi", "yo"), ("c", "second", None)]
    assert list(first_human_turns(cut)) == [("a", "hi", "yo")]
