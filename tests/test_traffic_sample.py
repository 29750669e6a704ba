"""The traffic sample (router/traffic_sample.py): what a router keeps of its finished requests for
re-distilling drafts, bounded, aged out, never logged; read back by `specserve distill --sample`.
Then an in-process service (fake workers, no Ray) keeping it, and the distill command training a
head from it."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time

import pytest
from pydantic import ValidationError

from specserve.router.traffic_sample import TrafficSample, TrafficSampleConfig, read_sample

HOUR = 3600.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def sample(tmp_path, clock=None, **config) -> TrafficSample:
    settings = TrafficSampleConfig(dir=str(tmp_path / "sample"), **({"share": 1.0} | config))
    return TrafficSample(settings, "router-a", random.Random(0), clock or Clock())


def test_the_latest_requests_are_kept_per_task_and_written_per_router(tmp_path):
    kept = sample(tmp_path, max_per_task=3)
    for i in range(5):
        assert kept.offer("sql", f"SELECT {i}", f" FROM t{i};")
    kept.offer("math", "1+1=", "2")
    assert kept.counts() == {"sql": 3, "math": 1}
    kept.flush()
    lines = (tmp_path / "sample" / "sql" / "router-a.jsonl").read_text().splitlines()
    assert [json.loads(line)["prompt"] for line in lines] == ["SELECT 2", "SELECT 3", "SELECT 4"]
    assert list(read_sample(tmp_path / "sample", "sql")) == [f"SELECT {i} FROM t{i};" for i in (2, 3, 4)]


def test_requests_age_out_of_the_sample_and_of_what_distill_reads(tmp_path):
    clock = Clock()
    kept = sample(tmp_path, clock, retention_hours=24.0)
    kept.offer("sql", "old", " one")
    clock.now += 20 * HOUR
    kept.offer("sql", "new", " one")
    kept.flush()
    assert list(read_sample(tmp_path / "sample", "sql", 10.0, clock)) == ["new one"]  # distill --sample-hours 10
    clock.now += 5 * HOUR  # the first is 25 h old now
    assert kept.counts() == {"sql": 1}
    kept.flush()  # no new request: the expired one leaves the file all the same
    assert list(read_sample(tmp_path / "sample", "sql")) == ["new one"]
    kept.offer("sql", "newest", " one")
    kept.flush()
    assert list(read_sample(tmp_path / "sample", "sql")) == ["new one", "newest one"]


def test_files_of_routers_gone_longer_than_the_retention_are_deleted_and_all_are_read_in_time_order(tmp_path):
    import os

    clock = Clock()
    a, b = sample(tmp_path, clock), sample(tmp_path, clock)
    b.router_id = "router-b"
    a.offer("sql", "a1", "."), b.offer("sql", "b1", ".")
    clock.now += 60
    a.offer("sql", "a2", "."), b.offer("sql", "b2", ".")
    a.flush(), b.flush()
    assert list(read_sample(tmp_path / "sample", "sql")) == ["a1.", "b1.", "a2.", "b2."]  # interleaved by time
    gone = tmp_path / "sample" / "sql" / "router-b.jsonl"  # router-b stopped; its file was last written long ago
    os.utime(gone, (clock.now - 25 * HOUR, clock.now - 25 * HOUR))
    a.offer("sql", "a3", ".")
    a.flush()
    assert not gone.exists() and list(read_sample(tmp_path / "sample", "sql")) == ["a1.", "a2.", "a3."]


def test_the_flushing_thread_writes_without_traffic_and_once_more_at_the_stop(tmp_path):
    kept = sample(tmp_path, flush_seconds=0.05).start()
    kept.offer("sql", "SELECT", " 1;")
    path = tmp_path / "sample" / "sql" / "router-a.jsonl"
    deadline = time.monotonic() + 10
    while not path.exists():
        assert time.monotonic() < deadline, "the thread did not write the sample"
        time.sleep(0.05)
    kept.offer("sql", "SELECT", " 2;")
    kept.stop()
    assert list(read_sample(tmp_path / "sample", "sql")) == ["SELECT 1;", "SELECT 2;"]


def test_a_share_of_requests_is_kept_and_none_of_their_text_is_logged(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="specserve")
    kept = sample(tmp_path, share=0.25, flush_seconds=1e-9)
    taken = sum(kept.offer("sql", f"secret prompt {i}", f" secret output {i}") for i in range(400))
    assert 60 < taken < 140 and kept.counts()["sql"] == taken
    kept.flush()
    assert "traffic sample: keeping 25% of finished requests" in caplog.text and "sql" in caplog.text
    assert "secret" not in caplog.text
    assert not kept.offer("sql", "a prompt", "")  # nothing committed: nothing to learn from


def test_what_is_wrong_with_a_sample_is_said(tmp_path):
    with pytest.raises(ValidationError):
        TrafficSampleConfig(dir="x", share=0.0)
    kept = sample(tmp_path)
    kept.offer("sql", "SELECT", " 1;")
    kept.flush()
    with pytest.raises(ValueError, match="nothing for task 'code'; it has: sql"):
        list(read_sample(tmp_path / "sample", "code"))
    with pytest.raises(ValueError, match="set router.traffic_sample.dir"):
        list(read_sample(tmp_path / "nowhere", "sql"))
    (tmp_path / "sample" / "sql" / "router-b.jsonl").write_text('{"time": 1, "prompt": "x"}\n')
    with pytest.raises(ValueError, match="router-b.jsonl:1 is not a traffic sample entry"):
        list(read_sample(tmp_path / "sample", "sql"))


def test_a_service_keeps_its_finished_requests_and_says_how_many(tiny_engine, tmp_path):
    from fake_workers import FakeDirectory, FakeWorker

    from specserve.proto.v1 import specserve_pb2 as pb
    from specserve.router.config import RouterConfig
    from specserve.router.service import SpecServeService
    from specserve.router.tasks import TaskResolver
    from specserve.router.validation import Limits

    tasks = {"sql": ("sql",)}
    workers = [FakeWorker(kind, f"{kind[0]}0", tiny_engine.target) for kind in ("draft", "target")]
    config = RouterConfig(tasks=tasks, default_task="sql", segments=("enterprise",),
                          traffic_sample={"dir": str(tmp_path / "sample"), "share": 1.0})
    service = SpecServeService(tiny_engine.tokenizer, Limits(tasks, ("sql",), tiny_engine.context_window,
                                                             frozenset(config.segments)),
                               FakeDirectory(*workers), config, TaskResolver(frozenset(tasks), "sql", None, 0.6),
                               random.Random(0))

    async def served(prompt: str, segment: str) -> str:
        turn = await service.admit(pb.GenerateRequest(prompt=prompt, max_tokens=6, segment=segment))
        return "".join([chunk.text async for chunk in service.run(turn, None)])

    outputs = [asyncio.run(served(f"SELECT name FROM t{i}", "enterprise")) for i in range(3)]
    service.sample.flush()
    assert list(read_sample(tmp_path / "sample", "sql")) == [f"SELECT name FROM t{i}{out}" for i, out in enumerate(outputs)]
    stats = asyncio.run(service.GetStats(pb.GetStatsRequest(), None))
    assert [t.sampled_requests for t in stats.tasks if t.task == "sql" and not t.draft] == [3]
    assert [(s.segment, s.requests) for s in stats.segments] == [("enterprise", 3)]


def test_distill_trains_a_head_from_a_services_traffic_sample(tiny_zoo, tmp_path, capsys):
    from specserve.cluster.cli import main

    kept = sample(tmp_path)
    for prompt in tiny_zoo.prompts("sql") * 4:
        kept.offer("sql", prompt, " FROM users WHERE id = 1;")
    kept.flush()
    out = tmp_path / "head"
    code = main(["distill", "--method", "eagle3", "--target", str(tiny_zoo.target_dir), "--sample",
                 str(tmp_path / "sample"), "--task", "sql", "--out", str(out), "--steps", "10", "--tokens", "4000",
                 "--draft-vocab", "128"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    facts = json.loads(captured.out)
    assert facts["sample"] == {"dir": str(tmp_path / "sample"), "task": "sql", "requests": len(tiny_zoo.prompts("sql")) * 4}
    assert main(["distill", "--target", str(tiny_zoo.target_dir), "--sample", str(tmp_path / "sample"),
                 "--task", "code", "--out", str(tmp_path / "x")]) == 2
    assert "nothing for task 'code'; it has: sql" in capsys.readouterr().err
