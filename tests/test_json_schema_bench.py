"""The JSON-schema bench's report without a service (bench/json_schema.py): the speedup each path
keeps under the schema, the share of valid outputs, and the check that decides validity."""

from __future__ import annotations

import json

import pytest

from specserve.bench.json_schema import JsonSchemaSettings, Level, follows_schema, report


def level(mode: str, path: str, tokens_per_s: float, valid: int = 0) -> Level:
    """A level whose passes each commit two tokens: an accepted draft token and the target's own."""
    passes = int(tokens_per_s) // 2
    return Level(mode, path, 16, tokens=int(tokens_per_s), accepted=passes, passes=passes, seconds=1.0, valid=valid,
                 outputs=8)


def test_the_report_says_each_speedup_and_goal():
    levels = [level("free", "off", 100), level("free", "auto", 300), level("json", "off", 80, 8),
              level("json", "auto", 200, 7)]
    text, goals = report(levels, {"json auto 16": [8, 8]}, JsonSchemaSettings(clients=(16,), paths=("off", "auto")),
                         "specserve json-schema")
    met = {g["name"]: (round(g["measured"], 3), g["met"]) for g in goals}
    assert met["auto, 16 clients: constrained speedup 2.50x over free 3.00x, kept >= 0.9"] == (0.833, False)
    assert met["off, 16 clients: outputs that parse and follow the schema"] == (1.0, True)
    assert met["auto, 16 clients: outputs that parse and follow the schema"] == (0.875, False)
    assert "| json | auto | 16 | 200 | 2.00 | 2.50x | 7/8 |" in text and "json auto 16 8/8" in text


def test_valid_means_it_parses_and_follows_the_schema():
    good = {"task": "sql", "answer": "x", "confidence": 7, "tags": ["a"]}
    assert follows_schema(json.dumps(good))
    assert not follows_schema(json.dumps(good | {"confidence": 101}))
    assert not follows_schema(json.dumps(good)[:-1])  # cut short by max_tokens


def test_a_run_records_the_commit_and_the_machine_it_ran_on():
    from specserve.bench.settings import SOURCE, provenance

    if not (SOURCE / ".git").exists():
        pytest.skip("not a git checkout: no commit to record")
    origin = provenance()
    assert len(origin["commit"]) == 40 and isinstance(origin["uncommitted_changes"], bool)
    assert origin["machine"]["cpus"] >= 1 and origin["machine"]["torch"]
