"""`specserve bench`: a smoke run on the tiny zoo (a couple of prompts per task, two load levels) in a
subprocess with a cluster of its own, then checks that the report has every section and that every
figure in it was computed from the run's measurements: the saved samples re-derive the saved
figures and re-render the saved report exactly, and the figures move when the samples do."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specserve.bench import figures as F
from specserve.bench.report import render_report
from specserve.bench.samples import AUTO, ENGINE_OFF, ENGINE_TASK, GREEDY_PATHS, OFF, TASK, Sample
from specserve.cluster.cli import main

PROMPTS, CONCURRENCY, LOAD_REQUESTS = 2, (1, 2), 4
SECTIONS = ("## Goals", "## 1. Speedup by task", "## 2. Cost of distribution", "## 3. The peer",
            "## 4. Routing", "## 5. Load", "## 6. Sampling", "## 7. Resident memory",
            "## 8. Where the time goes")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_dir(tiny_zoo, specserve_home, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"SPECSERVE_HOME": specserve_home}
    proc = subprocess.run(
        [sys.executable, "-m", "specserve.cluster.cli", "bench", "--zoo", str(tiny_zoo.root), "--out", str(out),
         "--prompts", str(PROMPTS), "--warm-up", "1", "--max-tokens", "16", "--sampled-prompts", "1",
         "--concurrency", ",".join(map(str, CONCURRENCY)), "--load-requests", str(LOAD_REQUESTS)],
        capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "goals:" in proc.stdout and "report: " in proc.stdout, proc.stdout
    (run,) = out.iterdir()
    return run


@pytest.fixture(scope="module")
def results(run_dir) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def test_the_run_writes_a_report_its_results_and_three_plots(run_dir, results):
    report = (run_dir / "report.md").read_text()
    positions = [report.index(s) for s in SECTIONS]
    assert positions == sorted(positions), "sections out of order"
    for plot in ("speedup_by_task.png", "alpha_heatmap.png", "load.png"):
        data = (run_dir / plot).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, plot
        assert f"]({plot})" in report
    assert set(results) == {"meta", "samples", "memory", "policy", "figures"}
    assert {r["task"] for r in results["policy"]} >= set(results["meta"]["tasks"])
    for goal in results["figures"]["goals"]:  # printed beside the figures
        assert goal["name"] in report and goal["threshold"] in report


def test_every_figure_is_derived_from_the_samples_and_the_report_from_the_figures(run_dir, results):
    samples = [Sample.from_record(r) for r in results["samples"]]
    assert F.derive(results["meta"], samples, results["memory"]) == results["figures"]
    plots = sorted(p.name for p in run_dir.glob("*.png"))
    assert render_report(results, plots) == (run_dir / "report.md").read_text()


def test_the_figures_move_with_the_measurements(results):
    """A figure that did not come from the samples would not notice them change."""
    samples = [Sample.from_record(r) for r in results["samples"]]
    slower = copy.deepcopy(samples)
    for s in slower:
        if s.section == "greedy" and s.path == TASK:
            s.seconds *= 2
    before, after = F.derive(results["meta"], samples, results["memory"]), F.derive(results["meta"], slower, results["memory"])
    for task, row in before["tasks"].items():
        assert after["tasks"][task]["speedup"]["median"] == pytest.approx(row["speedup"]["median"] / 2)
        assert after["tasks"][task]["bound"] == row["bound"]  # alpha, c and k did not change


def test_every_section_was_measured_and_every_output_is_the_targets(results, tiny_zoo):
    f, meta = results["figures"], results["meta"]
    assert meta["prompts"]["checked"] == 16 * len(tiny_zoo.tasks)
    for task, row in f["tasks"].items():
        assert row["runs"] == PROMPTS
        assert row["identical"] == {p: PROMPTS for p in GREEDY_PATHS if p != OFF}, task  # lossless, and HF agrees
        assert row["speedup"]["n"] == PROMPTS and row["routed"]["speedup"]["n"] == PROMPTS
        assert row["c"] > 0 and row["bound"] > 0 and row["of_bound"] > 0 and row["tokens_per_pass"] >= 1
        for section in ("engine", "peer"):
            assert all(v["n"] == PROMPTS for v in row[section].values() if isinstance(v, dict)), (task, section)
    assert set(f["alpha_matrix"]) == set(tiny_zoo.tasks)
    assert all(set(row) == set(tiny_zoo.draft_names) for row in f["alpha_matrix"].values())
    assert {t for t in f["sampling"]} == set(tiny_zoo.tasks)
    assert all(set(temps) == {"0.7", "1"} for temps in f["sampling"].values())
    for level in CONCURRENCY:
        modes = f["load"][str(level)]
        for mode in (OFF, AUTO):
            assert modes[mode]["requests"] == LOAD_REQUESTS and modes[mode]["tokens_per_second"] > 0
            assert 0 < modes[mode]["ttft_p50"] <= modes[mode]["p50"]
        assert modes[AUTO]["identical"] == LOAD_REQUESTS
    assert set(f["memory"]) == {"target replica", "draft worker", "router"}
    assert all(v > 50 for m in f["memory"].values() for v in m["rss_mib"])  # a Python process with torch loaded
    assert {g["met"] for g in f["goals"] if "8 clients" in g["name"]} == {None}  # 8 clients were not run


def test_derived_figures_on_known_samples():
    def run(path: str, prompt: int, seconds: float, **kw) -> Sample:
        return Sample("greedy", "sql", path, prompt, tokens=100, seconds=seconds, **kw)

    drafted = dict(proposed=40, accepted=30, rejections=10, target_passes=25)
    samples = [run(OFF, 0, 2.0, target_passes=100, verify_seconds=1.0), run(OFF, 1, 3.0, target_passes=100, verify_seconds=1.0),
               run(TASK, 0, 1.0, verify_seconds=0.375, **drafted), run(TASK, 1, 1.0, verify_seconds=0.375, **drafted),
               run(ENGINE_OFF, 0, 1.0, target_passes=100, verify_seconds=1.0),
               run(ENGINE_TASK, 0, 1.0, draft_seconds=0.2, verify_seconds=0.4, **drafted)]
    row = F.derive({"tasks": ["sql"], "k": 4}, samples, [])["tasks"]["sql"]
    assert row["alpha"] == 0.75 and row["tokens_per_pass"] == 4.0
    assert row["c"] == pytest.approx((0.2 / 40) / (1.0 / 100))  # 0.5, from the engine's paths
    assert row["w"] == pytest.approx((0.015 / 0.01 - 1) / 4)  # a 5-token verify pass costs 1.5 target-only passes
    assert row["speedup"]["median"] == 2.5 and row["speedup"]["min"] == 2.0 and row["speedup"]["max"] == 3.0
    expected = (1 - 0.75 ** 5) / 0.25
    assert row["bound"] == pytest.approx(expected / (1 + 4 * 0.5))
    assert row["bound_with_w"] == pytest.approx(expected / (1 + 4 * 0.5 + 4 * 0.125))
    assert row["of_bound"] == pytest.approx(2.5 / row["bound"])
    assert F.spread([]) is None and F.spread([float("nan")]) is None


def test_bench_refuses_bad_settings_before_starting_anything(capsys):
    assert main(["bench", "--prompts", "0"]) == 2
    assert "prompts must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--concurrency", "1,x"])


def test_components_are_found_by_process_title_even_mid_call():
    from specserve.bench.memory import component_of

    assert component_of("ray::ServeReplica:specserve:router") == "router"
    assert component_of("ray::ServeReplica:specserve:router.check_health") == "router"  # the flake CI could hit
    assert component_of("ray::ServeReplica:specserve:target.Verify()") == "target replica"
    assert component_of("ray::DraftWorker.__init__") == "draft worker"
    assert component_of("ray::ServeController") is None and component_of("python -m pytest") is None
