"""`specserve bench`: a smoke run (the slow suite) on the tiny zoo (a couple of prompts per task, two load levels, the
first also with batching off, the transformers peers) in a subprocess with a cluster of its own,
then checks that the report has every section and that every figure in it was computed from the
run's measurements: the saved samples re-derive the saved figures and re-render the saved report
exactly, the plots draw those figures, and the figures move when the samples do. The load
section's parts (the peers, its figures, its counters) are also checked on their own, without Ray."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
from matplotlib.container import BarContainer
from matplotlib.figure import Figure

from specserve.bench import figures as F
from specserve.bench.load import mixed_requests, pass_record, reference_outputs
from specserve.bench.load_figures import derive_load
from specserve.bench.peers import left_padded, run_generate_batch, run_static, until_eos
from specserve.bench.plots import ALPHA_PLOT, LOAD_PLOT, SPEEDUP_PLOT, write_plots
from specserve.bench.report import render_report
from specserve.bench.samples import (AUTO, ENGINE_OFF, ENGINE_TASK, GREEDY_PATHS, OFF, OFF_UNBATCHED, PEER_BATCH,
                                     PEER_STATIC, TASK, Sample)
from specserve.bench.settings import BenchSettings
from specserve.cluster.cli import main
from specserve.workers.prompt import encode_prompt

PROMPTS, CONCURRENCY, LOAD_REQUESTS = 2, (1, 2), 4
# The smoke run takes 2-3 minutes with a cluster of its own: the slow suite's (make test-slow); the
# parts below without it run by default.
SMOKE_RUN = pytest.mark.slow
SECTIONS = ("## Goals", "## 1. Speedup by task", "## 2. Cost of distribution", "## 3. The peer",
            "## 4. Routing", "## 5. Load", "## 6. Sampling", "## 7. Resident memory",
            "## 8. Where the time goes", "## 9. The capacity planner against this run")


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


@SMOKE_RUN
def test_the_run_writes_a_report_its_results_and_three_plots(run_dir, results):
    report = (run_dir / "report.md").read_text()
    positions = [report.index(s) for s in SECTIONS]
    assert positions == sorted(positions), "sections out of order"
    for plot in (SPEEDUP_PLOT, ALPHA_PLOT, LOAD_PLOT):  # what they show: test_the_plots_show_the_figures
        assert (run_dir / plot).is_file() and f"]({plot})" in report
    assert set(results) == {"meta", "samples", "memory", "policy", "load", "figures", "planner"}
    # the planner's model beside each load level it was checked on, OFF and AUTO (bench/plan_check.py)
    rows = results["planner"]["rows"]
    assert {(r["clients"], r["path"]) for r in rows} == {(c, p) for c in CONCURRENCY for p in ("off", "auto")}
    assert all(r["tokens_per_second"]["predicted"] > 0 and r["tpot_p99"]["measured"] > 0 for r in rows)
    assert {r["task"] for r in results["policy"]} >= set(results["meta"]["tasks"])
    for goal in results["figures"]["goals"]:  # printed beside the figures
        assert goal["name"] in report and goal["threshold"] in report
    device = results["meta"]["machine"]["device"]  # --device auto: the CPU here, named with its dtype
    assert device["device"] == "cpu" and f"models on cpu in {device['dtype']}" in report


def test_placement_on_cuda_shares_one_gpu_between_separate_processes():
    from specserve.bench.device import placement

    on_gpu = placement("cuda", draft_workers=2)
    assert on_gpu["target"] == {"device": "gpu", "gpus": 0.5}
    assert on_gpu["draft_pool"] == {"device": "gpu", "gpus": 0.25}  # 0.5 + 2 x 0.25: one GPU
    assert placement("cpu", 2)["target"]["device"] == "resource"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a CUDA device")
def test_asking_for_cuda_without_one_says_so():
    from specserve.bench.device import resolve

    assert resolve("auto") == "cpu"
    with pytest.raises(ValueError, match="no CUDA device"):
        resolve("cuda")


@SMOKE_RUN
def test_every_figure_is_derived_from_the_samples_and_the_report_from_the_figures(run_dir, results):
    samples = [Sample.from_record(r) for r in results["samples"]]
    assert F.derive(results["meta"], samples, results["memory"], results["load"]) == results["figures"]
    plots = sorted(p.name for p in run_dir.glob("*.png"))
    assert render_report(results, plots) == (run_dir / "report.md").read_text()


@SMOKE_RUN
def test_the_plots_show_the_figures(run_dir, results, tmp_path, monkeypatch):
    """Each saved plot is, pixel for pixel, what results.json's figures draw, and what they draw is
    those figures: a bar per task and path at its median speedup with the bound beside it, a heat-map
    cell per task and draft at its alpha, a line per load path through its tokens/s and its p99."""
    drawn: dict[str, Figure] = {}
    save = Figure.savefig

    def keep(figure: Figure, path, *args, **kwargs):
        drawn[Path(path).name] = figure
        return save(figure, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    figures = results["figures"]
    assert sorted(p.name for p in write_plots(figures, results["meta"], tmp_path)) == sorted(drawn) == sorted(
        (SPEEDUP_PLOT, ALPHA_PLOT, LOAD_PLOT))
    for name in drawn:
        saved = matplotlib.image.imread(run_dir / name)  # [height, width, RGBA]
        assert np.array_equal(saved, matplotlib.image.imread(tmp_path / name)), f"{name}: not the figures' plot"
        colours = np.unique(saved.reshape(-1, saved.shape[-1]), axis=0)
        assert min(saved.shape[:2]) >= 300 and len(colours) > 100, (name, saved.shape, len(colours))  # not blank

    tasks, rows = list(figures["tasks"]), list(figures["tasks"].values())
    (speedup,) = drawn[SPEEDUP_PLOT].axes
    assert [label.get_text() for label in speedup.get_xticklabels()] == tasks
    bars = [[bar.get_height() for bar in c] for c in speedup.containers if isinstance(c, BarContainer)]
    assert bars == [[r["speedup"]["median"] for r in rows], [r["routed"]["speedup"]["median"] for r in rows]]
    assert [r["bound"] for r in rows] in [c.get_offsets()[:, 1].tolist() for c in speedup.collections]

    matrix = figures["alpha_matrix"]
    drafts = sorted({d for row in matrix.values() for d in row})
    heat = drawn[ALPHA_PLOT].axes[0]  # (the other: its colour bar)
    assert heat.images[0].get_array().tolist() == [[matrix[t][d] for d in drafts] for t in matrix]
    assert [label.get_text() for label in heat.get_yticklabels()] == list(matrix)
    assert [label.get_text() for label in heat.get_xticklabels()] == drafts

    levels = figures["load"]["levels"]
    clients = {path: sorted(int(n) for n in levels if path in levels[n]) for level in levels.values() for path in level}
    for axes, key in zip(drawn[LOAD_PLOT].axes, ("tokens_per_second", "p99"), strict=True):
        lines = sorted((line.get_xdata().tolist(), line.get_ydata().tolist()) for line in axes.lines)
        assert lines == sorted((n, [levels[str(c)][path][key] for c in n]) for path, n in clients.items()), key


@SMOKE_RUN
def test_the_figures_move_with_the_measurements(results):
    """A figure that did not come from the samples would not notice them change."""
    samples = [Sample.from_record(r) for r in results["samples"]]
    slower = copy.deepcopy(samples)
    for s in slower:
        if s.section == "greedy" and s.path == TASK:
            s.seconds *= 2
    before, after = (F.derive(results["meta"], s, results["memory"], results["load"]) for s in (samples, slower))
    for task, row in before["tasks"].items():
        assert after["tasks"][task]["speedup"]["median"] == pytest.approx(row["speedup"]["median"] / 2)
        assert after["tasks"][task]["bound"] == row["bound"]  # alpha, c and k did not change


def test_outputs_of_no_tokens_are_said_apart_from_identical_ones():
    from specserve.bench.report import _identical

    assert _identical({"identical": {TASK: 4, "hf_assisted": 3}, "runs": 4, "empty": 2}) == "4/4 (2 of 0 tokens)"
    assert _identical({"identical": {TASK: 4}, "runs": 4, "empty": 0}) == "4/4"


@SMOKE_RUN
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
    load = f["load"]
    for level in CONCURRENCY:
        paths = load["levels"][str(level)]
        assert set(paths) == {OFF, AUTO, PEER_STATIC, PEER_BATCH} | ({OFF_UNBATCHED} if level == 1 else set()), (
            results["load"]["unbatched"], results["load"]["peer_errors"])
        for path, m in paths.items():
            assert m["requests"] == LOAD_REQUESTS and m["tokens_per_second"] > 0, (level, path)
            # Greedy: every path's output is the target's alone, batched or not (the tiny target's
            # logits are far apart; a flip on another model is reported by the bench, not hidden).
            assert m["identical"] == m["compared"] == LOAD_REQUESTS, (level, path)
        for mode in (OFF, AUTO):
            assert 0 < paths[mode]["ttft_p50"] <= paths[mode]["p50"]
            assert 0 < paths[mode]["tpot_p50"] <= paths[mode]["tpot_p99"] < paths[mode]["p99"]
        for mode in (OFF, AUTO, OFF_UNBATCHED) if level == 1 else (OFF, AUTO):
            passes = load["passes"][str(level)][mode]["target"]
            assert passes["passes"] > 0 and passes["sessions_per_pass"] >= 1 and passes["pass_width"] >= 1
    assert load["passes"]["1"][OFF_UNBATCHED]["target"]["sessions_per_pass"] == 1  # batching off: one per pass
    assert load["ratios"]["1"]["off_p50_over_unbatched"] > 0 and load["ratios"]["2"]["off_over_peer_static"] > 0
    assert load["peer_errors"] == {}  # generate_batch runs on CPU in transformers 5.23
    assert load["rss"]["clients"] == max(CONCURRENCY)
    components = {"target replica", "draft worker", "router", "control"}
    assert {p["component"] for p in load["rss"]["processes"]} == components
    assert set(f["memory"]) == components
    assert all(v > 50 for m in f["memory"].values() for v in m["rss_mib"])  # a Python process with torch loaded
    assert {g["met"] for g in f["goals"] if "16 clients" in g["name"]} == {None}  # 16 clients were not run
    assert next(g for g in f["goals"] if "batching on / off" in g["name"])["measured"] > 0


def test_derived_figures_on_known_samples():
    def run(path: str, prompt: int, seconds: float, **kw) -> Sample:
        return Sample("greedy", "sql", path, prompt, tokens=100, seconds=seconds, **kw)

    # 25 passes of k = 4 commit 100 tokens: 75 accepted and the target's own 25 (alpha 75 / (75 + 25)).
    drafted = dict(proposed=100, accepted=75, rejections=25, target_passes=25)
    # Through the service each run also drafted 20 tokens ahead that no proposal used.
    served = drafted | dict(drafted=120, wasted=20, draft_seconds=0.24)
    samples = [run(OFF, 0, 2.0, target_passes=100, verify_seconds=1.0), run(OFF, 1, 3.0, target_passes=100, verify_seconds=1.0),
               run(TASK, 0, 1.0, verify_seconds=0.375, **served), run(TASK, 1, 1.0, verify_seconds=0.375, **served),
               run(ENGINE_OFF, 0, 1.0, target_passes=100, verify_seconds=1.0),
               run(ENGINE_TASK, 0, 1.0, draft_seconds=0.5, verify_seconds=0.4, drafted=100, **drafted)]
    row = F.derive({"tasks": ["sql"], "k": 4}, samples, [])["tasks"]["sql"]
    assert row["alpha"] == 0.75 and row["tokens_per_pass"] == 4.0
    assert row["c"] == pytest.approx((0.5 / 100) / (1.0 / 100))  # 0.5, from the engine's paths
    # Per drafted token through the service, the wasted ones included: (0.48 s / 240) / (2.0 s / 200) = 0.2,
    # not the 0.24 a charge per proposed token (200) would give; a sixth of the draft's work was wasted.
    assert row["c_service"] == pytest.approx(0.2) and row["wasted"] == pytest.approx(40 / 240)
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
    with pytest.raises(ValueError, match="sections must be among"):
        BenchSettings(sections=("load", "speed"))
    with pytest.raises(SystemExit):
        main(["bench", "--concurrency", "1,x"])


def test_components_are_found_by_process_title_even_mid_call():
    from specserve.bench.memory import component_of

    assert component_of("ray::ServeReplica:specserve:router") == "router"
    assert component_of("ray::ServeReplica:specserve:router.check_health") == "router"  # the flake CI could hit
    assert component_of("ray::ServeReplica:specserve:target.Verify()") == "target replica"
    assert component_of("ray::ServeReplica:specserve:control") == "control"
    assert component_of("ray::DraftWorker.__init__") == "draft worker"
    assert component_of("ray::ServeController") is None and component_of("python -m pytest") is None


def test_a_static_batch_decodes_each_prompt_as_it_decodes_alone(tiny_zoo, tiny_engine):
    """Left padding and the attention mask leave every row's greedy output what the target gives the
    prompt alone (the engine's target-only decode); the rows of a batch share its time."""
    from specserve.workers.request import GenerationParams

    from specserve.workers.loading import ModelSpec, load_model

    tokenizer = tiny_engine.tokenizer
    model = load_model(ModelSpec(str(tiny_zoo.target_dir)))  # as the peers' process loads it (no engine attention)
    texts = [tiny_zoo.prompts(task)[0] for task in tiny_zoo.tasks]
    prompts = [encode_prompt(tokenizer, text) for text in texts]
    assert len(set(map(len, prompts))) > 1  # some rows are padded
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    batched, alone = run_static(model, prompts, 3, 12, eos, pad), run_static(model, prompts, 1, 12, eos, pad)
    expected = [tiny_engine.generate(t, GenerationParams(max_tokens=12, speculation=False)).complete().token_ids
                for t in texts]
    assert [d.token_ids for d in batched] == [d.token_ids for d in alone] == expected
    assert [d.index for d in batched] == list(range(len(prompts)))
    assert batched[0].started == batched[2].started < batched[3].started  # batches of 3, one after another
    assert batched[0].seconds == batched[2].seconds > 0
    continuous = run_generate_batch(model, prompts, 2, 12, eos, pad)
    assert [d.token_ids for d in continuous] == expected


def test_left_padding_and_eos():
    ids, mask = left_padded([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert until_eos([4, 9, 2, 9], 2) == [4, 9] and until_eos([4, 9], 2) == [4, 9]


def test_load_levels_cycle_over_the_same_prompts():
    prompts = {"code": ["c0", "c1"], "sql": ["s0", "s1"]}
    assert mixed_requests(prompts, 5, 3) == [("code", 0, "c0"), ("sql", 0, "s0"), ("code", 1, "c1"),
                                             ("code", 0, "c0"), ("sql", 0, "s0")]
    settings = BenchSettings(concurrency=(1, 4, 16), load_requests=6, unbatched_levels=(1, 32))
    assert [settings.level_requests(c) for c in settings.concurrency] == [6, 8, 32] and settings.unbatched() == (1,)


def test_pass_counts_are_the_workers_growth_over_a_run():
    def worker(kind: str, passes: int, tokens: int, sessions: int, pool: int = 0) -> dict:
        return {"kind": kind, "passes": passes, "pass_tokens": tokens, "pass_sessions": sessions,
                "kv_pool_bytes": pool, "kv_budget_bytes": 100, "max_pass_sessions": sessions and 4}

    before = {"t": worker("target", 10, 40, 10), "d1": worker("draft", 0, 0, 0)}
    after = {"t": worker("target", 20, 140, 40, pool=60), "d1": worker("draft", 8, 16, 16),
             "d2": worker("draft", 5, 5, 5)}  # d2 came up during the run: no baseline, left out
    record = pass_record(OFF, 8, before, after)
    assert record["target"] == {"passes": 10, "pass_tokens": 100, "pass_sessions": 30, "max_pass_sessions": 4,
                                "kv_pool_of_budget": 0.6}
    assert record["draft"]["passes"] == 8 and record["draft"]["pass_sessions"] == 16
    figures = derive_load([], {"passes": [record]})["passes"]["8"][OFF]
    assert figures["target"]["sessions_per_pass"] == 3 and figures["target"]["pass_width"] == 10
    assert figures["draft"]["sessions_per_pass"] == 2


def test_load_figures_on_known_samples():
    def request(path: str, clients: int, prompt: int, started: float, seconds: float, ids: list[int]) -> Sample:
        return Sample("load", "sql", path, prompt, tokens=len(ids), seconds=seconds, concurrency=clients,
                      started=started, token_ids=ids)

    samples = [request(OFF_UNBATCHED, 1, 0, 0.0, 1.0, [1, 2]), request(OFF_UNBATCHED, 1, 1, 1.0, 1.0, [3, 4]),
               request(OFF, 1, 0, 0.0, 0.5, [1, 2]), request(OFF, 1, 1, 0.5, 0.5, [3, 4]),
               request(OFF, 2, 0, 0.0, 0.5, [1, 2]), request(OFF, 2, 1, 0.0, 0.5, [3, 4]),
               request(AUTO, 2, 0, 0.0, 0.25, [1, 2]), request(AUTO, 2, 1, 0.0, 1.0, [3, 9]),
               request(PEER_STATIC, 2, 0, 0.0, 0.25, [1, 2]), request(PEER_STATIC, 2, 1, 0.0, 0.25, [3, 4])]
    reference = reference_outputs(samples)
    assert reference == {("sql", 0): [1, 2], ("sql", 1): [3, 4]}  # batching off, fewest clients
    for s in samples:
        s.identical = s.token_ids == reference[(s.task, s.prompt)]
    rss = {"clients": 2, "before": [{"component": "router", "pid": 7, "rss_bytes": 100 * 2**20},
                                    {"component": "target replica", "pid": 8, "rss_bytes": 100 * 2**20}],
           "after": [{"component": "router", "pid": 7, "rss_bytes": 110 * 2**20},
                     {"component": "target replica", "pid": 8, "rss_bytes": 150 * 2**20}],
           "kv_pool_growth": {"8": 48 * 2**20}}  # a new arena: within the pool's budget, no leak
    load = derive_load(samples, {"rss": rss, "unbatched": "levels 1"})
    assert load["levels"]["1"][OFF]["tokens_per_second"] == 4.0 and load["levels"]["1"][OFF_UNBATCHED]["tokens_per_second"] == 2.0
    assert load["levels"]["2"][OFF]["tokens_per_second"] == 8.0 and load["levels"]["2"][PEER_STATIC]["tokens_per_second"] == 16.0
    assert load["levels"]["2"][AUTO]["identical"] == 1 and load["levels"]["2"][AUTO]["compared"] == 2
    assert load["levels"]["2"][OFF]["ttft_p50"] is None and load["levels"]["2"][OFF]["tpot_p50"] is None  # not streamed
    one, two = load["ratios"]["1"], load["ratios"]["2"]
    assert one["off_over_unbatched"] == 2.0 and one["off_p50_over_unbatched"] == 0.5 and one["auto_over_off"] is None
    assert two["auto_over_off"] == pytest.approx(4 / 1.0 / 8) and two["off_over_peer_static"] == 0.5
    assert two["off_over_one_client"] == 2.0
    router, target = load["rss"]["processes"]
    assert router["growth"] == router["growth_beyond_pool"] == pytest.approx(1.1)
    assert target["growth"] == pytest.approx(1.5) and target["growth_beyond_pool"] == pytest.approx(1.02)
    goals = {g.name: g for g in F.load_goals(load, F.Goals())}
    rss_goal = goals["2 clients: RSS after (less KV pool) over before"]
    assert rss_goal.met is False and rss_goal.measured == pytest.approx(1.1)  # the router's growth is no pool's
    assert goals["1 client: OFF p50, batching on / off"].met is True
    assert goals["16 clients: OFF over static-batch peer"].met is None  # 16 clients not run


def test_figures_match_hand_worked_samples():
    """A few samples whose figures are worked out by hand here (not by the functions that make them)."""
    greedy = [  # task sql, k 3: two prompts, each decoded target-only (OFF) and with its draft (TASK)
        Sample("greedy", "sql", OFF, 0, tokens=40, seconds=2.0, target_passes=40, verify_seconds=1.6),
        Sample("greedy", "sql", TASK, 0, tokens=40, seconds=1.0, target_passes=16, accepted=24, rejections=8,
               proposed=40, drafted=40, draft="sql", k=3, verify_seconds=1.0),
        Sample("greedy", "sql", OFF, 1, tokens=20, seconds=1.0, target_passes=20, verify_seconds=0.8),
        Sample("greedy", "sql", TASK, 1, tokens=20, seconds=0.8, target_passes=10, accepted=10, rejections=5,
               proposed=24, drafted=24, draft="sql", k=3, verify_seconds=0.6),
        # c in process: 60 drafted tokens in 0.3 s (5 ms each) over 50 target-only passes in 1.0 s (20 ms each)
        Sample("greedy", "sql", ENGINE_TASK, 0, tokens=40, seconds=1.0, drafted=60, draft_seconds=0.3, draft="sql"),
        Sample("greedy", "sql", ENGINE_OFF, 0, tokens=40, seconds=1.0, target_passes=50, verify_seconds=1.0),
    ]
    load = [  # two clients, three requests: the level's wall time is 0 .. 2.5 s
        Sample("load", "sql", OFF, 0, tokens=20, seconds=2.0, first_token_seconds=0.2, first_chunk_tokens=1,
               concurrency=2, started=0.0),
        Sample("load", "sql", OFF, 1, tokens=30, seconds=2.0, first_token_seconds=0.3, first_chunk_tokens=1,
               concurrency=2, started=0.5),
        Sample("load", "sql", OFF, 2, tokens=10, seconds=1.0, first_token_seconds=0.1, first_chunk_tokens=1,
               concurrency=2, started=1.0),
    ]
    figures = F.derive({"k": 3, "tasks": ["sql"]}, greedy + load, [])
    row = figures["tasks"]["sql"]
    assert row["speedup"]["median"] == pytest.approx((40 / 1.0) / (40 / 2.0) / 2 + (20 / 0.8) / (20 / 1.0) / 2)  # 1.625
    assert row["speedup"]["min"] == pytest.approx(1.25) and row["speedup"]["max"] == pytest.approx(2.0)
    assert row["alpha"] == pytest.approx(34 / 47)  # accepted / (accepted + rejections)
    assert row["tokens_per_pass"] == pytest.approx(60 / 26)  # tokens per target pass: its accepted ones and its own
    assert row["c"] == pytest.approx(0.005 / 0.020)
    a, c = 34 / 47, 0.25
    assert row["bound"] == pytest.approx((1 - a ** 4) / (1 - a) / (3 * c + 1))  # Leviathan et al., k = 3
    # w: a verify pass's device time (1.6 s / 26 passes) over a target-only pass's (2.4 s / 60), less 1, per token
    assert row["w"] == pytest.approx((1.6 / 26 / 0.04 - 1) / 3)
    level = figures["load"]["levels"]["2"][OFF]
    assert level["requests"] == 3 and level["tokens_per_second"] == pytest.approx(60 / 2.5)
    assert level["p50"] == pytest.approx(2.0) and level["ttft_p50"] == pytest.approx(0.2)
    assert level["tpot_p50"] == pytest.approx((2.0 - 0.2) / 19)  # of 1.8/19, 1.7/29, 0.9/9: the middle one


def test_the_cascade_bench_runs_every_path_against_target_only(tiny_zoo):
    """`python -m specserve.bench.cascade` on the tiny zoo, one prompt: a row per path, every output
    target-only's, and its table."""
    from specserve.bench.cascade import CascadeSettings, measure, paths, report

    settings = CascadeSettings(zoo=str(tiny_zoo.root), tasks=("sql",), prompts=1, max_tokens=8, cascade_k=(1, 2),
                               min_p=(0.0, 1.0))
    rows = measure(settings, say=lambda line: None)
    assert paths(settings) == ["off", "draft", "ngram", "cascade@0,k=1", "cascade@1,k=1", "cascade@0,k=2",
                               "cascade@1,k=2"]
    assert all(rows["sql"][path]["identical"] and rows["sql"][path]["tokens"] == 8 for path in paths(settings))
    assert "| sql (sql) |" in report(rows, settings)


def test_the_bridge_modes_bench_runs_both_conversions_against_target_only(tiny_zoo, other_tokenizer_draft):
    """`python -m specserve.bench.bridge_modes` on the tiny zoo's draft of another tokenizer, one
    prompt: the intersection and the conversion through text, every greedy output target-only's."""
    from specserve.bench.bridge_modes import measure, report

    rows = measure(str(tiny_zoo.root), (2,), 1, 8, say=lambda line: None, draft=other_tokenizer_draft, tasks=("sql",))
    assert list(rows["sql"]) == ["off", "intersection,k=2", "text,k=2"]
    assert all(row["identical"] and row["tokens"] == 8 for row in rows["sql"].values())
    assert "| sql |" in report(rows)
