"""Cache-aware picking without Ray (router/prefix_routing.py): the worker that was sent the longest
prefix of a prompt gets its session, unless it is busier than the least loaded by more than the slack."""

from __future__ import annotations

from collections import Counter

from specserve.router.prefix_routing import LOAD, PREFIX, PrefixMemory, choose, prompt_blocks
from specserve.workers.registry import Endpoint

SYSTEM = list(range(100, 200))  # 100 tokens: three whole blocks before a question's last token


def replicas(*names: str) -> list[Endpoint]:
    return [Endpoint("target", name, f"{name}:1") for name in names]


def test_the_longest_remembered_prefix_wins_within_the_slack_and_load_decides_beyond_it():
    memory = PrefixMemory()
    a, b, c = replicas("a", "b", "c")
    memory.remember("b", prompt_blocks(SYSTEM + [1, 2, 3]))
    memory.remember("c", prompt_blocks(SYSTEM[:40] + [9] * 60))  # one block in common
    blocks = prompt_blocks(SYSTEM + [4, 5])
    matched = {e.worker_id: memory.matched(e.worker_id, blocks) for e in (a, b, c)}
    assert matched == {"a": 0, "b": 3, "c": 1}
    assert choose([a, b, c], Counter(a=0, b=3, c=0), matched, slack=4) == (b, PREFIX)
    assert choose([a, b, c], Counter(a=0, b=6, c=0), matched, slack=4) == (c, PREFIX)  # b too busy: c's one block
    assert choose([a, b, c], Counter(a=0, b=6, c=6), matched, slack=4) == (a, LOAD)
    assert choose([a, b, c], Counter(), {}, slack=4) == (a, LOAD)  # nothing remembered: least loaded, by name


def test_memory_is_bounded_and_forgets_a_worker_that_is_gone():
    memory = PrefixMemory(capacity=4)
    memory.remember("a", prompt_blocks(list(range(200))))  # 6 blocks: the first two pushed out
    blocks = prompt_blocks(list(range(200)))
    assert len(memory.sent["a"]) == 4 and memory.matched("a", blocks) == 6  # the chain's deepest hash still there
    assert memory.matched("a", blocks[:2]) == 0
    memory.forget("a")
    assert memory.matched("a", blocks) == 0


def test_a_prompt_too_short_for_a_whole_block_has_nothing_to_match():
    assert prompt_blocks(list(range(32))) == [] and len(prompt_blocks(list(range(33)))) == 1


def test_the_directory_sends_a_prompt_back_where_its_prefix_went_until_that_worker_fails():
    import asyncio
    import time

    from specserve.router.directory import WorkerDirectory

    directory = WorkerDirectory(registry=None, failed_cooldown=1.0)
    a, b = directory.endpoints = replicas("a", "b")
    directory.refreshed = time.monotonic() + 3600  # no registry to ask: these are the endpoints
    pick = lambda prompt: asyncio.run(directory.pick_for("target", prompt=prompt))  # noqa: E731
    assert pick(SYSTEM + [1]) == (a, LOAD)
    directory.load["a"] += 1  # its session is open
    assert pick(SYSTEM + [2]) == (a, PREFIX)  # one more session there, within the slack
    assert pick([7] * 10) == (b, LOAD)  # a short prompt: the least loaded
    directory.mark_failed(a)
    assert pick(SYSTEM + [3]) == (b, LOAD)  # a failed worker is passed over, and its cache forgotten
