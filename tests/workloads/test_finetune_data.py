"""Generated function-calling data, Glaive-format validation, packing, and the offline tokenizer."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from workloads.finetune import data as fcd
from workloads.finetune._tokenizer import EOS, build_tokenizer


def test_generation_is_deterministic_and_seeded() -> None:
    assert fcd.generate(50, seed=7) == fcd.generate(50, seed=7)
    assert fcd.generate(50, seed=7) != fcd.generate(50, seed=8)


def test_generated_records_are_glaive_shaped_calls_of_an_offered_function() -> None:
    for record in fcd.generate(200, seed=0):
        fcd.check_record(record, "generated")
        assert record["system"].startswith(fcd.SYSTEM_PREFIX)
        call = record["chat"].split("<functioncall> ", 1)[1].split(f" {fcd.EOT}", 1)[0]
        # Glaive writes the arguments as a JSON string in single quotes inside the call object.
        name = json.loads(call.split(', "arguments": ')[0] + "}")["name"]
        arguments = json.loads(call.split("'")[1])
        assert f'"name": "{name}"' in record["system"]
        function = next(f for f in fcd.FUNCTIONS if f.name == name)
        assert set(arguments) == set(function.parameters)


def test_reply_spans_cover_exactly_the_assistant_turns() -> None:
    text, spans = fcd.text_and_spans(fcd.generate(1, seed=3)[0])
    replies = [text[a:b] for a, b in spans]
    assert replies and all(r.rstrip().endswith(fcd.EOT) for r in replies)
    assert replies[0].lstrip().startswith("<functioncall>")
    assert not any("USER:" in r or "SYSTEM:" in r for r in replies)


def test_jsonl_round_trip(tmp_path: Path) -> None:
    records = fcd.generate(5, seed=1)
    path = fcd.write_jsonl(records, tmp_path / "data.jsonl")
    assert fcd.read_jsonl(path) == records
    assert fcd.read_jsonl(path, limit=2) == records[:2]


@pytest.mark.parametrize(("line", "expected"), [
    ('{"system": "s"}', r":3: missing key 'chat'"),
    ('{"system": "s", "chat": 5}', r":3: key 'chat' is a int, not a string"),
    ('{"system": "s", "chat": "hello"}', r":3: 'chat' has no 'USER:' turn"),
    ('["system", "chat"]', r":3: got a JSON list"),
    ('{"system": "s", "chat": ', r":3: not valid JSON"),
])
def test_bad_lines_are_named_with_path_and_line(tmp_path: Path, line: str, expected: str) -> None:
    good = json.dumps(fcd.generate(1, seed=0)[0])
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{good}\n\n{line}\n")  # the blank line still counts: the error names line 3
    with pytest.raises(fcd.DataFormatError, match=expected) as info:
        fcd.read_jsonl(path)
    assert str(path) in str(info.value)


def test_missing_and_empty_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(fcd.DataFormatError, match="dataset file not found"):
        fcd.read_jsonl(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(fcd.DataFormatError, match="no records"):
        fcd.read_jsonl(tmp_path / "empty.jsonl")


def test_tokenizer_is_built_offline_and_deterministically(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the tokenizer tried to reach the network")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    texts = [fcd.text_and_spans(r)[0] for r in fcd.generate(100, seed=0)]
    first, second = build_tokenizer(texts), build_tokenizer(texts)
    assert first.get_vocab() == second.get_vocab()
    ids = first(texts[0], add_special_tokens=False)["input_ids"]
    assert first.unk_token_id not in ids
    assert first.convert_tokens_to_ids(EOS) == first.eos_token_id
    assert first(f"USER: hi {EOS}", add_special_tokens=False)["input_ids"][-1] == first.eos_token_id
    assert first("zyxwvut", add_special_tokens=False)["input_ids"] == [first.unk_token_id]
    assert "get_current_weather" in first.decode(first("get_current_weather")["input_ids"])


def test_packing_marks_reply_tokens_and_wastes_no_padding() -> None:
    records = fcd.generate(40, seed=2)
    tokenizer = build_tokenizer(fcd.text_and_spans(r)[0] for r in records)
    ids, assistant = fcd.pack(records, tokenizer, seq_len=64)
    assert ids.shape == assistant.shape and ids.shape[1] == 64
    assert tokenizer.pad_token_id not in ids.tolist()
    replies = tokenizer.convert_ids_to_tokens(ids[assistant].tolist())
    prompts = tokenizer.convert_ids_to_tokens(ids[~assistant].tolist())
    assert "functioncall" in replies and "functioncall" not in prompts
    assert "USER" in prompts and "USER" not in replies
    with pytest.raises(fcd.DataFormatError, match="less than one block"):
        fcd.pack(records[:1], tokenizer, seq_len=100_000)
