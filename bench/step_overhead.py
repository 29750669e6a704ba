"""What a worker adds to a step beyond its forward passes, and where the service's CPU goes under load.

    .venv/bin/python -m specserve.bench.step_overhead draft [--zoo demo] [--k 5] [--steps 200] [--vary compiled]
        One draft step of k tokens at a time through a worker's scheduler (the device thread pinned
        to core 1), with ``batching.back_to_back`` (or ``--vary compiled``: ``batching.compiled``) on
        and off, alternating twice: the step's wall time, its device time, and the rest (the hops
        between the device thread and the event loop).

    .venv/bin/python -m specserve.bench.step_overhead cpu [--zoo demo] [--clients 16]
        An embedded service under ``clients`` concurrent greedy requests (the prompt alone, tasks
        mixed), OFF then AUTO, twice: tokens/s and each process's CPU seconds over the level's wall
        time (router, target replica, draft workers), and the cores each may run on. Shows whether
        drafting and the router compete for a core with each other (they do on a 2-core machine).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import psutil

from specserve.cluster.bringup import start_service
from specserve.cluster.client import SpecServeClient
from specserve.cluster.demo import MEASURED_ON_UNSEEN, ensure_zoo
from specserve.cluster.local import zoo_engine
from specserve.proto.v1 import specserve_pb2 as pb
from specserve.workers.acceptance import SamplingParams
from specserve.workers.batching import Scheduler
from specserve.workers.config import BatchingConfig
from specserve.workers.drafting import DraftSession
from specserve.workers.grpc_host import Device
from specserve.workers.kv_pool import Budget, KVPool, KVShape
from specserve.workers.ragged_pass import PooledSequence
from specserve.workers.seeds import DraftDraws
from specserve.cluster.zoo.zoo import Zoo

from .memory import component_of

DRAFT_CORE = 1  # as deploy/serve_config.yaml pins the draft workers


def draft_steps(zoo: Zoo, k: int, steps: int, config: BatchingConfig) -> tuple[list[float], list[float]]:
    """Wall and device seconds of ``steps`` draft steps of k tokens, one at a time (the first 10% left out)."""
    task = zoo.tasks[0]
    engine = zoo_engine(zoo, [zoo.default_draft(task)])
    draft = engine.drafts[zoo.default_draft(task)]
    prompt = engine.tokenizer.encode(zoo.prompts(task)[0])[:60]
    pool = KVPool(KVShape.of(draft), Budget(2**28))

    async def run() -> tuple[list[float], list[float]]:
        scheduler = Scheduler(draft, pool, Device(1, (DRAFT_CORE,)), config)
        if scheduler.graphs is not None:  # compiled: as a draft worker does before it registers
            await scheduler.device.run(scheduler.graphs.warm_up)
        walls, devices = [], []
        for _ in range(steps):
            sequence = PooledSequence(pool.take(len(prompt) + 4 * k), prompt)
            session = DraftSession(sequence, SamplingParams(), DraftDraws(0, task))
            await scheduler.run(session.step(1))  # the prompt's prefill, not timed
            session.resync(None, len(prompt), [])
            start = time.perf_counter()
            done = await scheduler.run(session.step(k))
            walls.append(time.perf_counter() - start)
            devices.append(done.device_seconds)
            pool.give_back(sequence.region)
        skip = steps // 10
        return walls[skip:], devices[skip:]
    return asyncio.run(run())


def report_draft(zoo: Zoo, k: int, steps: int, vary: str) -> None:
    for on in (True, False, True, False):
        walls, devices = draft_steps(zoo, k, steps, BatchingConfig(**{vary: on}))
        rest = [w - d for w, d in zip(walls, devices, strict=True)]
        print(f"{vary} {'on ' if on else 'off'}: a draft step of k={k}, medians over {len(walls)}: "
              f"wall {statistics.median(walls) * 1e3:.2f} ms, device {statistics.median(devices) * 1e3:.2f} ms, "
              f"rest {statistics.median(rest) * 1e3:.2f} ms", flush=True)


def service_processes() -> dict[int, tuple[psutil.Process, str]]:
    """The embedded service's processes (this process's descendants): pid -> (process, component)."""
    found = {}
    for process in psutil.Process().children(recursive=True):
        try:
            component = component_of(" ".join(process.cmdline()))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if component:
            found[process.pid] = (process, component)
    return found


def cpu_under_load(client: SpecServeClient, prompts: list[str], clients: int, mode: int) -> None:
    processes = service_processes()
    before = {pid: sum(process.cpu_times()[:2]) for pid, (process, _) in processes.items()}
    start = time.perf_counter()

    def one(i: int) -> int:
        request = pb.GenerateRequest(prompt=prompts[i % len(prompts)], max_tokens=64, speculation=mode)
        return len(client.generate(request).token_ids)

    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(one, range(2 * clients)))
    wall = time.perf_counter() - start
    name = "OFF" if mode == pb.SPECULATION_OFF else "AUTO"
    print(f"{clients} clients, {name}: {tokens / wall:.0f} tokens/s over {wall:.1f} s; each process's CPU over that time:")
    for pid, (process, component) in sorted(processes.items(), key=lambda item: item[1][1]):
        used = sum(process.cpu_times()[:2]) - before[pid]
        pinned = "" if component == "router" else "; its device thread pinned apart"
        print(f"  {component:15s} {used:6.2f} s = {used / wall:4.0%} of a core  (may run on cores "
              f"{sorted(process.cpu_affinity())}{pinned})", flush=True)


def report_cpu(zoo: Zoo, clients: int) -> None:
    service = start_service(port=0, overrides={"models": {"zoo": str(zoo.root)}, **copy.deepcopy(MEASURED_ON_UNSEEN)})
    client = SpecServeClient(service.address)
    prompts = [p for task in zoo.tasks for p in zoo.prompts(task)[:8]]
    try:
        for mode in (pb.SPECULATION_OFF, pb.SPECULATION_AUTO) * 2:
            cpu_under_load(client, prompts, clients, mode)
    finally:
        client.close()
        service.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("draft", "cpu"))
    parser.add_argument("--zoo", default="demo", help="a zoo preset name or directory (default: %(default)s)")
    parser.add_argument("--k", type=int, default=5, help="draft tokens per step (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=200, help="draft steps per round (default: %(default)s)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent requests (default: %(default)s)")
    parser.add_argument("--vary", choices=("back_to_back", "compiled"), default="back_to_back",
                        help="draft: the batching setting turned on and off (default: %(default)s)")
    args = parser.parse_args()
    zoo = ensure_zoo(args.zoo)
    if args.what == "draft":
        report_draft(zoo, args.k, args.steps, args.vary)
    else:
        report_cpu(zoo, args.clients)


if __name__ == "__main__":
    main()
