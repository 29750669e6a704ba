"""The bench's scripts as `specserve` commands (bench/commands.py), each run once with its smallest
settings on the tiny zoo: it still parses, runs and writes what it says, not a crash or an empty
table. What their numbers say is in docs/pages/. Those that start a cluster of their own (the soak,
the shift, the real-model bench) run in a process of their own, as a user runs them, and are slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specserve.cluster.cli import build_parser, main

SCRIPTS = ("soak", "shift", "plan-check", "gpu-bench", "carry", "real-model", "text-draft", "bridge-modes", "cascades",
           "quantized-drafts")
REPO = Path(__file__).resolve().parents[1]


def run(*argv: str) -> int:
    try:
        return main(list(argv))
    except SystemExit as exc:  # argparse's --help, and a script's own exit
        return exc.code or 0


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_is_listed_and_reads_its_own_flags(name, capsys):
    assert name in build_parser().format_help()
    assert run(name, "--help") == 0
    assert capsys.readouterr().out.startswith(f"usage: specserve {name}")
    assert run(name, "--no-such-flag") == 2  # refused (or its required arguments asked for) by its own parser
    assert capsys.readouterr().err.startswith(f"usage: specserve {name}")


def test_carry_writes_a_zoo_in_bfloat16_that_opens(tiny_zoo, tmp_path, capsys):
    from safetensors import safe_open

    from specserve.cluster.zoo.zoo import Zoo

    assert run("carry", "--zoo", str(tiny_zoo.root), "--out", str(tmp_path / "carried")) == 0
    assert "MiB" in capsys.readouterr().out
    carried = Zoo.open(tmp_path / "carried")
    weights = next(carried.target_dir.glob("*.safetensors"))
    with safe_open(str(weights), "pt") as f:
        assert {str(f.get_tensor(name).dtype) for name in f.keys()} == {"torch.bfloat16"}


def test_plan_check_scores_the_planner_on_a_committed_bench_run(tiny_zoo, tmp_path, capsys):
    """On the committed run 20261127-094901 (its pass curve recorded: nothing is timed here), its
    zoo path pointed at the tiny zoo (it reads no model)."""
    results = json.loads((REPO / "bench/results/20261127-094901/results.json").read_text())
    results["meta"]["zoo"]["path"] = str(tiny_zoo.root)
    (tmp_path / "calib").mkdir()
    (tmp_path / "calib/results.json").write_text(json.dumps(results))
    assert run("plan-check", str(tmp_path / "calib"), "--seeds", "1", "--out", str(tmp_path / "check")) == 0
    report = json.loads((tmp_path / "check/results.json").read_text())
    assert report["command"].startswith("specserve plan-check") and report["rows"]
    assert all(row["tokens_per_second"]["predicted"] > 0 for row in report["rows"]), report["rows"][0]
    assert "The bar" in capsys.readouterr().out


def test_cascades_compares_every_path_on_one_prompt(tiny_zoo, tmp_path, capsys):
    assert run("cascades", "--zoo", str(tiny_zoo.root), "--tasks", "sql", "--prompts", "1", "--max-tokens", "8",
               "--min-p", "1.0", "--out", str(tmp_path)) == 0
    (written,) = tmp_path.glob("*-cascade/cascade.json")
    rows = json.loads(written.read_text())["rows"]
    assert rows and "| sql (sql) |" in capsys.readouterr().out


def test_quantized_drafts_compares_a_draft_with_its_int8_self(tiny_zoo, tmp_path, capsys):
    assert run("quantized-drafts", "--zoo", str(tiny_zoo.root), "--tasks", "sql", "--prompts", "1", "--max-tokens",
               "8", "--out", str(tmp_path)) == 0
    (written,) = tmp_path.glob("*-quantized/quantized.json")
    row = json.loads(written.read_text())["rows"]["sql"]
    assert row["float"]["identical"] and row["int8"]["identical"]
    assert row["float"]["weight_bytes"] >= 3.5 * row["int8"]["weight_bytes"]
    assert "| sql (sql) |" in capsys.readouterr().out


def test_bridge_modes_runs_both_conversions(tiny_zoo, other_tokenizer_draft, tmp_path, capsys):
    assert run("bridge-modes", "--zoo", str(tiny_zoo.root), "--draft", str(other_tokenizer_draft), "--tasks", "sql",
               "--k", "2", "--prompts", "1", "--max-tokens", "8", "--out", str(tmp_path)) == 0
    (written,) = tmp_path.glob("*-bridge-modes/bridge-modes.json")
    rows = json.loads(written.read_text())["rows"]["sql"]
    assert list(rows) == ["off", "intersection,k=2", "text,k=2"] and all(row["identical"] for row in rows.values())
    assert "| sql |" in capsys.readouterr().out


def test_text_draft_trains_a_draft_that_loads(tiny_zoo, tmp_path, capsys):
    from specserve.workers.loading import ModelSpec, load_model

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(tiny_zoo.prompts("prose")[:8]))
    assert run("text-draft", "--target", str(tiny_zoo.target_dir), "--corpus", str(corpus), "--out",
               str(tmp_path / "draft"), "--steps", "2", "--batch-size", "2", "--seq-len", "16", "--rollouts", "2",
               "--new-tokens", "4") == 0
    assert json.loads(capsys.readouterr().out)["target"] == str(tiny_zoo.target_dir)
    assert load_model(ModelSpec(str(tmp_path / "draft"))).config.vocab_size > 0


def test_gpu_bench_dry_runs_on_the_cpu(tiny_zoo, tmp_path):
    assert run("gpu-bench", "--zoo", str(tiny_zoo.root), "--out", str(tmp_path), "--device", "cpu", "--dtype",
               "float32", "--prompts", "1", "--max-tokens", "4", "--sessions", "1") == 0
    assert (tmp_path / "report.md").read_text() and json.loads((tmp_path / "gpu.json").read_text())


def in_a_process(*argv: str, home: str, timeout: float, codes: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "specserve.cluster.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, SPECSERVE_HOME=home))
    assert done.returncode in codes, f"specserve {argv[0]} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_soak_serves_through_faults_and_loses_nothing(tiny_zoo, specserve_home, tmp_path):
    in_a_process("soak", "--zoo", "tiny", "--minutes", "0.3", "--clients", "2", "--fault-every", "6",
                 "--max-tokens", "16", "--out", str(tmp_path / "soak.json"), home=specserve_home, timeout=600)
    report = json.loads((tmp_path / "soak.json").read_text())
    assert report["requests"] > 0 and report["tokens_lost"] == 0, report


@pytest.mark.slow
def test_real_model_serves_a_model_of_ones_own(tiny_zoo, specserve_home, tmp_path):
    done = in_a_process("real-model", "--target", str(tiny_zoo.target_dir), "--max-tokens", "8", "--warm-up", "0",
                        "--no-hf", "--out", str(tmp_path), home=specserve_home, timeout=900)
    assert list(tmp_path.glob("*-real-model/results.json")), done.stdout[-2000:]


@pytest.mark.slow
def test_shift_runs_every_step(tiny_zoo, specserve_home, tmp_path):
    """Its exit status says whether the service caught up within the goal (1: not), which a zoo this
    small need not reach: judged here is that every step ran and was timed."""
    in_a_process("shift", "--zoo", "tiny", "--before-seconds", "10", "--after-seconds", "10", "--sample-requests", "8",
                 "--prompts", "8", "--steps", "10", "--tokens", "2000", "--alert-timeout", "120", "--out",
                 str(tmp_path), home=specserve_home, timeout=1500, codes=(0, 1))
    assert json.loads((tmp_path / "shift.json").read_text()) and (tmp_path / "shift.md").read_text()
