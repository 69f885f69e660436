"""Refusals read as plain sentences: no doubled word ("starting at at column 7").

Python's own JSON messages end some sentences in "at" ("Unterminated string starting
at", "Invalid control character at"), meant to be followed by its ": line 1 column 7";
the parsers add the position themselves. Every JSON syntax error Python can raise, and a
bad value in every field of every record kind and of a contract, goes through each
parser (JSONL records, a batch, a streamed file, contracts, a bare JSON text) and no
message may repeat a word.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ledger.canonical import JsonInputError, parse_json_strict
from ledger.records import parse_contracts, parse_jsonl, validate_batch
from ledger.stream import index_file
from tests import factories as f

DOUBLED = re.compile(r"\b(\w+)\s+\1\b", re.IGNORECASE)

#: One text per message of Python's JSON decoder (json/decoder.py, json/scanner.py).
BROKEN_JSON = [
    b"",  # Expecting value
    b"{",  # Expecting property name enclosed in double quotes
    b'{"a" 1}',  # Expecting ':' delimiter
    b'{"a": 1 "b": 2}',  # Expecting ',' delimiter
    b'{"a": "abc',  # Unterminated string starting at
    b'{"a": "a\x01b"}',  # Invalid control character at
    b'{"a": "\\q"}',  # Invalid \escape
    b'{"a": "\\u12"}',  # Invalid \uXXXX escape
    b'{"a": 1} x',  # Extra data
    b"[1, 2",  # Expecting ',' delimiter (array)
    b'{"a": tru}',  # Expecting value (a bad literal)
    b"\xef\xbb\xbf{}",  # byte order mark
    b'{"a": "\xff"}',  # invalid UTF-8
]


def _bad_values() -> list[Any]:
    return [None, "", "x", -1, 0, 1.5, True, [], {}, "2026-03-02T12:00:00", "\x00"]


def _records() -> list[dict[str, Any]]:
    fid = "6d1f3f4e-1111-4a4a-9a9a-123456789abc"
    good = [
        f.job_started(),
        f.rec("job_progress", job_id="j1", step=3, step_seconds=1.5),
        f.rec("job_finished", job_id="j1", step=9),
        f.failure(node="n1", gpu=3, step=4, detail="x"),
        f.outcome(fid),
        f.rec("exclusion", failure_event_id=fid, reason="r", approved_by="a"),
    ]
    out: list[dict[str, Any]] = [{"kind": "nope"}, {}]
    for rec in good:
        for key in rec:
            out.append({k: v for k, v in rec.items() if k != key})
            for value in _bad_values():
                out.append({**rec, key: value})
        out.append({**rec, "surplus": 1})
    return out


def _contracts() -> list[dict[str, Any]]:
    good = f.contract(renewal_value="10.00", gpu_hour_price="2.50",
                      terms={"threshold_percent": 90, "credit_percent": 25,
                             "covered_classes": ["unplanned"],
                             "excluded_causes": ["customer_code"]})
    out: list[dict[str, Any]] = []
    for key in good:
        out.append({k: v for k, v in good.items() if k != key})
        for value in _bad_values():
            out.append({**good, key: value})
    for key in good["terms"]:
        for value in _bad_values():
            out.append({**good, "terms": {**good["terms"], key: value}})
    return out


def _assert_plain(messages: list[str]) -> None:
    assert messages, "no message to check"
    doubled = [m for m in messages if DOUBLED.search(m)]
    assert not doubled, doubled


@pytest.mark.parametrize("text", BROKEN_JSON)
def test_json_syntax_errors_name_their_place_in_plain_words(text: bytes, tmp_path: Path) -> None:
    messages: list[str] = []
    with pytest.raises(JsonInputError) as exc:
        parse_json_strict(text)
    messages.append(str(exc.value))
    line = b'{"kind": "job_started"}\n' + text + b"\n"
    messages += [str(e) for e in parse_jsonl(line)[1]]
    messages += [str(e) for e in parse_contracts(b"[\n" + text + b"\n]")[1]]
    messages += [str(e) for e in parse_contracts(line)[1]]
    path = tmp_path / "records.jsonl"
    path.write_bytes(line)
    messages += [str(e) for e in index_file(path).errors]
    _assert_plain(messages)


def test_the_doubled_at_of_pythons_json_messages_is_gone() -> None:
    errors = parse_jsonl(b'{"a": "abc\n')[1]
    assert [e.message for e in errors] == ["invalid JSON: Unterminated string starting at column 7"]
    with pytest.raises(JsonInputError) as exc:
        parse_json_strict(b'{"a": "a\x01b"}')
    assert str(exc.value) == "invalid JSON: Invalid control character at line 1 column 9"


def test_field_errors_of_every_record_kind_read_plainly(tmp_path: Path) -> None:
    records = _records()
    messages = [str(e) for e in validate_batch(records)[1]]
    path = tmp_path / "records.jsonl"
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records))
    messages += [str(e) for e in index_file(path).errors]
    assert len(messages) > 2 * len(records) * 0.5
    _assert_plain(messages)


def test_contract_errors_read_plainly() -> None:
    contracts = _contracts()
    messages = [str(e) for e in parse_contracts(json.dumps(contracts).encode())[1]]
    assert len(messages) > len(contracts) / 2
    _assert_plain(messages)


def test_the_check_finds_a_doubled_word() -> None:
    assert DOUBLED.search("starting at at column 7")
    assert DOUBLED.search("The the record")
    assert not DOUBLED.search("at column 7, at line 2")
