"""The device thread: one model call at a time, and device times that do not count queueing."""

from __future__ import annotations

import asyncio
import os
import time

from specserve.workers.grpc_host import PINNING_ENV, Device, usable_cpus

BUSY, WORK = 0.3, 0.05


def test_device_time_excludes_the_wait_behind_other_calls():
    """A call queued behind another session's reports its own compute, not the wait: otherwise a
    cost measured from device times (the policy's w, GenerateStats.verify_seconds) grows with load."""
    device = Device(threads=1)

    async def main() -> tuple[float, float]:
        busy = asyncio.ensure_future(device.run(time.sleep, BUSY))
        await asyncio.sleep(0.01)  # the device thread is now busy
        start = time.perf_counter()
        _, seconds = await device.run_timed(time.sleep, WORK)
        waited = time.perf_counter() - start
        await busy
        return seconds, waited

    seconds, waited = asyncio.run(main())
    assert waited >= BUSY  # it did queue
    assert WORK <= seconds < BUSY / 2  # and reports only its own work


def test_cores_are_pinned_unless_the_deployment_turns_pinning_off(monkeypatch):
    mine = sorted(os.sched_getaffinity(0))
    assert usable_cpus((mine[0], 4096)) == {mine[0]}  # a core this process cannot have is skipped
    monkeypatch.setenv(PINNING_ENV, "off")  # what the KubeRay manifest sets: pods have their own share
    assert usable_cpus((mine[0],)) == set()
