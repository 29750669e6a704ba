"""The device thread: one model call at a time, and device times that do not count queueing."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from specserve.workers.grpc_host import PINNING_ENV, Device, usable_cpus

BUSY, WORK = 0.3, 0.05


def test_device_time_excludes_the_wait_behind_other_calls(monkeypatch):
    """A call queued behind another session's reports its own compute, not the wait: otherwise a
    cost measured from device times (the policy's w, GenerateStats.verify_seconds) grows with load.
    Timed on a clock that moves only when the calls say they computed, so a loaded machine's
    scheduling cannot move the figures."""
    from specserve.workers import grpc_host

    now = [0.0]
    monkeypatch.setattr(grpc_host.time, "perf_counter", lambda: now[0])
    device, release = Device(threads=1), threading.Event()

    def busy() -> None:  # another session's pass: holds the device until the second call is queued
        release.wait(10)
        now[0] += BUSY

    def work() -> None:
        now[0] += WORK

    async def main() -> float:
        first = asyncio.ensure_future(device.run(busy))
        second = asyncio.ensure_future(device.run_timed(work))
        await asyncio.sleep(0)  # both submitted: the second waits behind the first
        release.set()
        await first
        _, seconds = await second
        return seconds

    assert asyncio.run(main()) == pytest.approx(WORK)  # its own work, none of the BUSY it waited behind


def test_cores_are_pinned_unless_the_deployment_turns_pinning_off(monkeypatch):
    mine = sorted(os.sched_getaffinity(0))
    assert usable_cpus((mine[0], 4096)) == {mine[0]}  # a core this process cannot have is skipped
    monkeypatch.setenv(PINNING_ENV, "off")  # what the KubeRay manifest sets: pods have their own share
    assert usable_cpus((mine[0],)) == set()
