"""The shared-prefix bench's report without a service (bench/shared_prefix.py): its ratios, its
goals and a past run written again from its results."""

from __future__ import annotations

import json

from specserve.bench.shared_prefix import Level, SharedPrefixSettings, report, rerender, write


def level(cache: str, path: str, clients: int, ttft: float, tokens_per_s: float, reused: int) -> Level:
    return Level(cache, path, clients, ttft=[ttft] * 4, tokens=int(tokens_per_s), passes=int(tokens_per_s),
                 seconds=1.0, prompt_tokens={"target": 1000}, reused_tokens={"target": reused})


LEVELS = [level("on", "off", 16, 0.1, 400, 900), level("on", "auto", 16, 0.2, 300, 905),
          level("off", "off", 16, 0.4, 200, 0), level("off", "auto", 16, 0.3, 250, 0)]
SETTINGS = SharedPrefixSettings(clients=(16,), paths=("off", "auto"))


def test_the_report_says_each_ratio_and_goal():
    text, goals = report(LEVELS, {"off 16": [48, 48]}, SETTINGS, "specserve shared-prefix", 320)
    met = {g["name"]: (round(g["measured"], 2), g["met"]) for g in goals}
    assert met["off, 16 clients: TTFT off / on >= 3x"] == (4.0, True)
    assert met["auto, 16 clients: TTFT off / on >= 3x"] == (1.5, False)
    assert met["auto, 16 clients: throughput on / off > 1"] == (1.2, True)
    assert met["16 clients: target hit rate AUTO at most 1 point below OFF (points below)"] == (-0.5, True)
    assert "| on | off | 16 | 100.0 |" in text and "off 16 48/48" in text


def test_a_past_run_is_written_again_from_its_results(tmp_path):
    write(tmp_path, LEVELS, {"off 16": [48, 48]}, SETTINGS, "specserve shared-prefix", {"commit": "abc"})
    first = (tmp_path / "report.md").read_text()
    (tmp_path / "report.md").unlink()
    rerender(tmp_path)
    again = (tmp_path / "report.md").read_text()
    assert again.splitlines()[1:] == first.splitlines()[1:]  # all but the heading's time
    again = json.loads((tmp_path / "results.json").read_text())
    assert again["goals"] and again["provenance"] == {"commit": "abc"}  # the run's, not the re-writer's
