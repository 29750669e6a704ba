"""Each experiment of bench/experiments/ run once, with its smallest settings, on the tiny zoo: it
still runs, and what it prints is a measurement (every row there, every figure positive), not a
crash or an empty table. What the numbers say on a real machine is in bench/experiments/README.md.

Experiments that pin their own process to a core (stream_floor, router_ceiling, single_stream) run
in a process of their own, as a user runs them."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from specserve.bench.experiments import batched_pass, k_sweep, step_overhead


def run_experiment(name: str, *args: str, timeout: float = 300) -> str:
    """``python -m specserve.bench.experiments.NAME ARGS``'s stdout; its stderr when it fails."""
    done = subprocess.run([sys.executable, "-m", f"specserve.bench.experiments.{name}", *args], capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def table_rows(text: str) -> list[list[str]]:
    """The cells of a printed markdown table's body rows."""
    rows = [line.strip("|").split("|") for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    return [[cell.strip() for cell in row] for row in rows[1:]]  # the header left out


def number(cell: str) -> float:
    return float(cell.replace(",", ""))


def test_batched_pass_times_every_way_at_every_level(capsys):
    batched_pass.main(["--sessions", "1,2", "--cached", "8", "--queries", "1", "--repeats", "1"])
    lines = capsys.readouterr().out.splitlines()
    # A row: sessions, q, each way's "ms (ms per session)", then one by one / ragged.
    rows = [[float(n) for n in re.findall(r"[0-9.]+", line)] for line in lines[2:]]
    assert [row[:2] for row in rows] == [[1, 1], [2, 1]]
    for row in rows:
        assert len(row) == 2 + 2 * len(batched_pass.WAYS) + 1 and all(n > 0 for n in row[2:]), row


def test_k_sweep_gives_a_speedup_for_every_k_with_the_targets_output(client, tiny_zoo):
    task = tiny_zoo.tasks[0]
    speedups = k_sweep.sweep(client, tiny_zoo, [task], [1, 2], prompts=1, max_tokens=8)
    assert list(speedups) == [task] and list(speedups[task]) == [1, 2]
    assert all(s > 0 for s in speedups[task].values())  # the outputs were the target's (sweep checks)


def test_step_overhead_splits_a_draft_step_into_device_time_and_the_rest(tiny_zoo, capsys):
    step_overhead.main(["--zoo", str(tiny_zoo.root), "--k", "2", "--steps", "10"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("back_to_back")]
    assert [line.split(":")[0] for line in lines] == ["back_to_back on ", "back_to_back off"] * 2
    for line in lines:
        wall, device, rest = (float(line.split(f"{what} ")[1].split(" ms")[0]) for what in ("wall", "device", "rest"))
        assert wall >= device > 0 and rest >= 0, line


def test_stream_floor_measures_every_mode_at_every_level():
    rows = table_rows(run_experiment("stream_floor", "--streams", "1,2", "--chunks", "16", timeout=120))
    assert [(row[0], row[1]) for row in rows] == [(mode, s) for s in ("1", "2") for mode in ("yield", "woken", "woken x4")]
    for row in rows:
        assert number(row[2]) > 0 and number(row[3]) >= 0, row  # messages/s; CPU us (0 under one clock tick)


def test_router_ceiling_streams_every_level_through_the_real_router(tiny_zoo):
    rows = table_rows(run_experiment("router_ceiling", "--sessions", "1,4", "--min-tokens", "64", "--max-tokens", "8",
                                     "--zoo", str(tiny_zoo.root), timeout=180))
    assert [row[0] for row in rows] == ["1", "4"]
    for row in rows:
        assert number(row[1]) > 0 and number(row[2]) >= 0 and number(row[3]) >= 1.0, row


@pytest.mark.slow  # compiles the decode pass: over a minute with a cold inductor cache
def test_single_stream_decodes_the_same_tokens_eager_and_compiled(gguf_target, tmp_path):
    run_experiment("single_stream", "--target", gguf_target, "--tokens", "4", "--rounds", "1",
                   "--out", str(tmp_path), timeout=600)
    (folder,) = tmp_path.iterdir()
    report = json.loads((folder / "results.json").read_text())
    assert report["identical"] and report["compile_seconds"] > 0
    assert set(report["median"]) == {"as loaded", "eager", "compiled"}
    assert all(rate > 0 for rate in report["median"].values())
    assert (folder / "report.md").read_text().startswith("# One target-only stream")
