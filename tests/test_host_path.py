"""The host-path bench's parts that need no cluster: its zoo, its CPU accounting and its report."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from specserve.bench.host_path import COMPONENTS, Level, cpu_by_component, report, summarize
from specserve.cluster.zoo.head import HEAD
from specserve.cluster.zoo.host_path import MEDUSA, ensure_host_path_zoo
from specserve.workers.heads.mtp import MTP, is_mtp
from specserve.cluster.zoo.zoo import Zoo


# Builds the bench's host-path zoo (~31 s on an AMD EPYC 2-core host): with the slow suite.
@pytest.mark.slow
def test_the_host_path_zoo_has_cheaper_drafts_that_accept_every_greedy_token(tiny_zoo, tmp_path):
    zoo = ensure_host_path_zoo(tiny_zoo, tmp_path / "host-path")
    assert Zoo.open(zoo.root).tasks == tiny_zoo.tasks and zoo.prompts(zoo.tasks[0]) == tiny_zoo.prompts(zoo.tasks[0])
    target = AutoModelForCausalLM.from_pretrained(zoo.target_dir)
    assert sum(p.numel() for p in target.parameters()) < 200_000  # its pass costs next to nothing
    ids = torch.tensor([[1, 5, 9, 11, 7, 3, 20]])
    with torch.no_grad():
        logits = target(ids).logits
        for name in zoo.draft_names:
            if name in (HEAD, MEDUSA):  # heads of the target: their directories load as such elsewhere
                assert (zoo.root / zoo.manifest["drafts"][name]["path"] / "config.json").exists()
                continue
            if name == MTP:  # the target itself, carrying a module: it drafts with that
                assert is_mtp(zoo.draft_dir(name))
                continue
            draft = AutoModelForCausalLM.from_pretrained(zoo.draft_dir(name))
            assert draft.config.num_hidden_layers < target.config.num_hidden_layers  # its pass costs less
            assert torch.equal(draft(ids).logits, logits), f"draft {name} is not the target's function"
    ids = ids[:, :4]
    eos = target.config.eos_token_id
    out = target.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=None)
    assert eos not in out[0, 4:].tolist(), "greedy requests run to their max_tokens"
    assert ensure_host_path_zoo(tiny_zoo, tmp_path / "host-path").root == zoo.root  # built once


def test_cpu_is_summed_by_component_and_priced_per_token_and_round():
    table = {1: (None, "router"), 2: (None, "draft worker"), 3: (None, "draft worker"), 4: (None, "client")}
    before = {1: (1.0, 0.0), 2: (0.5, 0.25), 3: (0.0, 0.0)}
    after = {1: (1.5, 0.0), 2: (1.0, 0.5), 3: (0.25, 0.25), 4: (0.1, 0.0)}
    used, device, counted = cpu_by_component(table, before, after)
    assert used == {"router": 0.5, "draft worker": 0.75, "client": 0.1} and counted["draft worker"] == 2
    assert device["draft worker"] == 0.5
    level = Level("draft", 64, requests=2, tokens=1000, rounds=250, seconds=2.0, cpu_seconds=used, device_seconds=device)
    assert level.tokens_per_second == 500
    assert level.us_per_token("draft worker") == 750 and level.us_per_round("router") == 2000
    assert level.host_us_per_token("draft worker") == 250
    off = Level("off", 64, requests=2, tokens=1000, rounds=1000, seconds=1.0, cpu_seconds=used)
    meta = {"when": "now", "zoo": "z", "target_parameters": 1, "max_tokens": 64, "k": 4, "command": "c",
            "machine": "m", "paths": ["off", "draft"], "sessions": [64]}
    engine = [{"path": p, "tokens": 10, "rounds": 10, "tokens_per_second": 100.0, "cpu_us_per_token": 1.0}
              for p in ("off", "draft")]
    text = report([off, level], {"scheduler": [{"sessions": 64, "tokens_per_second": 2000.0, "cpu_us_per_token": 5}],
                                 "engine": engine}, {"off": [2, 2], "draft": [2, 2]}, meta)
    assert "| 64 | 0.50x |" in text  # draft over off at 64 sessions
    assert "| 64 | 2,000 | 5 | 0 | 1,000 | 0.50x |" in text  # service OFF over the in-process scheduler
    assert "at its cheapest level" not in text and "off 2,000 (64 sessions), draft 2,000 (64 sessions)." in text
    assert all(name in COMPONENTS for name in used)
    # Without OFF among the paths (``--paths draft``), the ratios over it are left out, not a crash.
    alone = report([level], {"scheduler": [], "engine": engine[1:]}, {"draft": [2, 2]}, meta | {"paths": ["draft"]})
    assert "| draft | 100 | 1 | - | 0 | - |" in alone


def test_a_profile_names_the_functions_holding_the_gil(tmp_path):
    raw = tmp_path / "router.txt"
    raw.write_text("main (router/service.py:10);step (workers/loop.py:5) 3\n"
                   "main (router/service.py:12);write (grpc/aio/_call.py:500) 1\n")
    summary = summarize(raw)
    assert summary["samples"] == 4
    assert summary["ours_inclusive"][0] == ("main (router/service.py)", 1.0)
    assert ("step (workers/loop.py)", 0.75) in summary["self"]


def test_the_device_thread_is_named_for_tools_outside_the_process():
    import asyncio
    import threading

    from specserve.workers.grpc_host import DEVICE_THREAD, Device

    def own_name() -> str:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as comm:
            return comm.read().strip()

    assert asyncio.run(Device(1).run(own_name)) == DEVICE_THREAD
