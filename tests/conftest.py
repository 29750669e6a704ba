"""Shared fixtures: one tiny zoo per test session (built for real: corpora, tokenizer, training,
distillation), in a temporary SPECSERVE_HOME so tests never touch the user's cache."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from specserve.cluster.zoo.build import build_zoo
from specserve.cluster.zoo.head import HEAD
from specserve.cluster.zoo.presets import get_preset
from specserve.cluster.zoo.zoo import Zoo


@pytest.fixture(scope="session")
def specserve_home(tmp_path_factory) -> str:
    home = tmp_path_factory.mktemp("specserve-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECSERVE_HOME", str(home))
    yield str(home)
    mp.undo()


@pytest.fixture(scope="session")
def tiny_zoo(specserve_home) -> Zoo:
    from pathlib import Path

    return build_zoo(get_preset("tiny"), Path(specserve_home) / "zoo" / "tiny")


# Medusa heads on the tiny zoo's target, distilled for the session (tests/test_medusa.py, and served
# by the session's service for MEDUSA_TASK): ~15 s here. The tiny target is predictable: 150 steps
# reach 0.9-1.0 acceptance.
MEDUSA_TASKS = ("sql", "code")
MEDUSA_TASK = "guessed"


@pytest.fixture(scope="session")
def medusa_heads(tiny_zoo, tmp_path_factory):
    """(their directory, what distill measured of them)."""
    from specserve.cluster.zoo.head_distill import HeadEvaluation, distill_medusa
    from specserve.cluster.zoo.presets import MedusaTraining
    from specserve.cluster.zoo.presets import TrainBudget

    where = tmp_path_factory.mktemp("medusa")
    corpus = []
    for task in MEDUSA_TASKS:
        documents = tiny_zoo.corpus(task)
        (where / f"{task}.txt").write_text("\n\n".join([*documents.train, *documents.held_out]))
        corpus.append(str(where / f"{task}.txt"))
    settings = MedusaTraining(train_tokens=8_000, budget=TrainBudget(steps=150, batch_size=4, learning_rate=1e-3))
    facts = distill_medusa(str(tiny_zoo.target_dir), corpus, str(where / "heads"), settings,
                           HeadEvaluation(prompts=4, max_tokens=32))
    return where / "heads", facts


# The tiny zoo's target written again carrying an MTP module distilled for the session
# (tests/test_mtp.py, and served by the session's service for MTP_TASK, from the draft workers,
# and for MTP_HERE_TASK, from the target replica, as draft MTP_HERE: models.on_replica).
MTP_TASK = "predicted"
MTP_HERE_TASK, MTP_HERE = "predicted-here", "mtp-here"


# A draft of another tokenizer for the tiny zoo's target (cluster/zoo/other_tokenizer.py: ~5 s
# here), served by the session's service for OTHER_TASK alone.
OTHER_TASK = "translated"
# The tiny zoo's sql draft again, served with int8 weights (models.quantize), for QUANTIZED_TASK alone.
QUANTIZED_DRAFT, QUANTIZED_TASK = "sql-int8", "quantized"


@pytest.fixture(scope="session")
def other_tokenizer_draft(tiny_zoo, tmp_path_factory):
    """The directory of a draft whose tokenizer is not the target's (its own BPE, 1.5x as large)."""
    from specserve.cluster.zoo.other_tokenizer import ensure_other_tokenizer_draft

    return ensure_other_tokenizer_draft(tiny_zoo, tmp_path_factory.mktemp("other") / "draft")


@pytest.fixture(scope="session")
def mtp_target(tiny_zoo, medusa_heads, tmp_path_factory):
    """(the target carrying its module, what distill measured of it); trained on Medusa's text."""
    from specserve.cluster.zoo.head_distill import HeadEvaluation, distill_mtp
    from specserve.cluster.zoo.presets import HeadTraining
    from specserve.cluster.zoo.presets import TrainBudget

    corpus = [str(medusa_heads[0].parent / f"{task}.txt") for task in MEDUSA_TASKS]
    where = tmp_path_factory.mktemp("mtp") / "target"
    settings = HeadTraining(sequence_tokens=64, train_tokens=8_000,
                            budget=TrainBudget(steps=80, batch_size=8, learning_rate=3e-3))
    facts = distill_mtp(str(tiny_zoo.target_dir), corpus, str(where), settings, HeadEvaluation(prompts=4, max_tokens=32))
    return where, facts


@pytest.fixture(scope="session")
def tiny_engine(tiny_zoo):
    import torch

    from specserve.cluster.local import zoo_engine

    # In-process models on one thread, as a worker's device runs them: on this 2-core machine two
    # threads oversubscribe the cores whenever anything else runs, and every pass slows ~5x.
    torch.set_num_threads(1)
    return zoo_engine(tiny_zoo, tiny_zoo.draft_names)


@pytest.fixture(scope="session")
def gguf_target(tiny_zoo, tmp_path_factory) -> str:
    """The tiny zoo's target as an f32 GGUF file (tokenizer inside): a path for ``--target``."""
    from gguf_export import write_gguf

    return str(write_gguf(tiny_zoo.target_dir, tmp_path_factory.mktemp("gguf") / "target.gguf"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def metrics_port() -> int:
    return free_port()


@contextlib.contextmanager
def serve_in_subprocess(args: list[str], env: dict, log: Path | None = None):
    """`specserve serve ARGS` as a user runs it, in a process of its own; yields (client, process)
    once it prints its ready line, and stops it with SIGTERM at the end unless the test did."""
    from specserve.cluster.client import SpecServeClient

    stderr = log.open("w") if log else subprocess.DEVNULL
    if "--http-port" not in args:  # 8000 may be taken on a shared machine
        args = [*args, "--http-port", "off"]
    proc = subprocess.Popen([sys.executable, "-m", "specserve.cluster.cli", "serve", *args],
                            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    try:
        line = proc.stdout.readline()  # blocks until the service is ready (or the process dies)
        assert line.startswith("specserve listening on "), (
            f"{line!r}, exit {proc.poll()}\n{log.read_text()[-3000:] if log else ''}")
        client = SpecServeClient(line.split()[3])
        proc.ready_line = line  # for what else it serves (the OpenAI API's address)
        try:
            yield client, proc
        finally:
            client.close()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="session")
def service(tiny_zoo, metrics_port, medusa_heads, mtp_target, other_tokenizer_draft):
    """The service on a real embedded Ray cluster, serving the tiny zoo; one per test session.

    The concurrency limit and queue are small so the RESOURCE_EXHAUSTED test can reach them. Its
    target replica serves the session's Medusa heads, for MEDUSA_TASK alone, and the MTP module of
    the session's target that carries one, for MTP_HERE_TASK alone; its draft workers the same
    module, for MTP_TASK alone, and a draft of another
    tokenizer, for OTHER_TASK alone, and the sql draft in int8, for QUANTIZED_TASK alone. Besides the zoo's
    tasks there is POOR_TASK, served only by the tiny zoo's worst draft, for the fallback tests;
    the policy judges after fewer trials than by default so they need little traffic. The table is
    the operator's and taken as written (router.as_written), so the routing and fallback tests see
    only the zoo's drafts: no draft-free proposers and no tree; `general` gets a tree (its draft,
    prompt lookup and suffix decoding), for the tree tests.
    """
    from specserve.cluster.bringup import start_service

    tasks = {task: list(drafts) for task, drafts in tiny_zoo.manifest["task_drafts"].items()}
    tasks |= {"general": ["general", "tree"], POOR_TASK: [worst_draft(tiny_zoo)], CANARY_TASK: ["eagle3", "sql"],
              ROUTED_TASK: routed_arms(tiny_zoo),
              MEDUSA_TASK: ["medusa"], MTP_TASK: ["mtp"], OTHER_TASK: ["other"],
              MTP_HERE_TASK: [MTP_HERE], QUANTIZED_TASK: [QUANTIZED_DRAFT]}
    router = {"max_concurrent_requests": SERVICE_CONCURRENCY, "max_queued_requests": SERVICE_QUEUE, "tasks": tasks,
              "as_written": list(tasks),
              "policy": {"min_trials": 32},
              # The tiny zoo's drafts seldom guess the verdict: left to the lookahead budget, most
              # requests would soon draft in turn, and the tests of the overlapped path (and the fault
              # tests' timing of a request that drafts ahead) would no longer run through it.
              "lookahead_min_hit_rate": 0.0,
              # Their distributions are flat too (top probabilities ~0.02): every lookahead drafts a
              # branch beside it, so the service's tests run through the branches and their adoption.
              "lookahead_branch_min_odds": 0.0,
              "segments": [LISTED_SEGMENT],
              "timeouts": SERVICE_TIMEOUTS}
    # Draft sessions outlast the target waits (a config that lets them not is refused). Drafts run
    # eagerly: compiling costs each draft worker a minute on a clean machine (every replacement the
    # fault tests start, seconds), and tests/test_graphs.py checks the compiled passes.
    draft_pool = {"session_idle_seconds": 100.0, "batching": {"compiled": False}}
    target = {"session_idle_seconds": SESSION_IDLE_SECONDS, "max_sessions": TARGET_SESSIONS}
    models = {"zoo": str(tiny_zoo.root),
              "drafts": {"medusa": str(medusa_heads[0]),  # served by the target replica
                         "mtp": str(mtp_target[0]),  # the same target carrying a module: drafts with it
                         MTP_HERE: str(mtp_target[0]),  # the same, drafting on the target replica
                         "other": str(other_tokenizer_draft),  # through the tokens it shares with the target
                         QUANTIZED_DRAFT: str(tiny_zoo.draft_dir("sql"))},
              "on_replica": [MTP_HERE], "quantize": {QUANTIZED_DRAFT: "int8"}}
    running = start_service(port=0, overrides={"models": models, "router": router,
                                               "target": target, "draft_pool": draft_pool},
                            metrics_port=metrics_port)
    yield running
    running.stop()


# Enough at once for the fault tests to strike a worker whose passes eight or more sessions share
# (the draft pool's two workers split a task's sessions).
SERVICE_CONCURRENCY = 16
SERVICE_QUEUE = 2
# Sessions the target replica takes: above the router's limit, so only the tests that fill the
# replica themselves (test_faults) find it full.
TARGET_SESSIONS = 24
# Steps: short enough for the fault tests to wait out, long enough on a loaded 2-core machine. A
# replacement replica takes ~20 s to start here (a new process importing torch and Ray Serve).
SERVICE_TIMEOUTS = {"draft_step_seconds": 2.0, "target_step_seconds": 4.0, "target_wait_seconds": 90.0,
                    "target_full_wait_seconds": 8.0}
# Target replicas evict a session idle this long: above the longest wait for a draft (prefill 10 s
# + a step 2 s), and short enough for the eviction test.
SESSION_IDLE_SECONDS = 13.0
POOR_TASK = "poor"
# Served by the EAGLE-3 head and the sql draft, for the canary tests (a head's versions and a draft
# model's): what a version that loses teaches the policy stays in this task's arms, not in a zoo
# task's that the routing tests judge.
CANARY_TASK = "canaried"
LISTED_SEGMENT = "enterprise"  # router.segments of the session's service: counted under its own name
# Served by the zoo's EAGLE-3 head and its worst draft, and sent the prompts of the task the head
# serves best (routed_prompts_task): a choice whose better arm is clear on any host, for the routing
# test. The zoo's own tasks do not promise one: their drafts are barely trained, and which of them
# wins a task depends on the host that trained it (on some, none is clearly ahead on any task).
ROUTED_TASK = "routed"


def worst_draft(zoo: Zoo) -> str:
    """The draft whose best acceptance on any task is lowest (the tiny zoo's are near 0)."""
    acceptance = zoo.manifest["acceptance"]
    return min(zoo.draft_names, key=lambda d: max(acceptance[task][d] for task in acceptance))


def routed_arms(zoo: Zoo) -> list[str]:
    """ROUTED_TASK's drafts: the EAGLE-3 head (it learns the target's own states: 0.58-1.0 served
    on every host seen) and the draft that learnt least (near 0 everywhere)."""
    return [HEAD, worst_draft(zoo)]


def routed_prompts_task(zoo: Zoo) -> str:
    """The zoo task whose prompts ROUTED_TASK is sent: the one its head accepts most on held out."""
    acceptance = zoo.manifest["acceptance"]
    return max(zoo.tasks, key=lambda task: acceptance[task][HEAD])


@pytest.fixture(scope="session")
def client(service):
    from specserve.cluster.client import SpecServeClient

    c = SpecServeClient(service.address)
    yield c
    c.close()


DASHBOARD = Path(__file__).parents[1] / "deploy" / "kuberay" / "grafana-dashboard.json"


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of every panel of the Grafana dashboard."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(panel["title"], target["expr"]) for panel in panels for target in panel.get("targets", [])]
