"""What a worker adds to a draft step beyond its forward passes.

One draft step of k tokens at a time through a worker's scheduler (the device thread pinned to
core 1, as deploy/serve_config.yaml pins the draft workers), with ``batching.back_to_back`` (or
``--vary compiled``: ``batching.compiled``) on and off, alternating twice: the step's wall time,
its device time, and the rest (the hops between the device thread and the event loop). Where the
service's CPU goes per process under load, `specserve host-path` measures.

    python -m specserve.bench.experiments.step_overhead [--zoo demo] [--k 5] [--steps 200] [--vary compiled]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from specserve.cluster.demo import ensure_zoo
from specserve.cluster.local import zoo_engine
from specserve.cluster.zoo.zoo import Zoo
from specserve.workers.sampling import SamplingParams
from specserve.workers.batching import Scheduler
from specserve.workers.config import BatchingConfig
from specserve.workers.drafting import DraftSession
from specserve.workers.grpc_host import Device
from specserve.workers.kv_pool import Budget, KVPool, KVShape
from specserve.workers.ragged_pass import PooledSequence
from specserve.workers.seeds import DraftDraws

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


def report(zoo: Zoo, k: int, steps: int, vary: str) -> None:
    for on in (True, False, True, False):
        walls, devices = draft_steps(zoo, k, steps, BatchingConfig(**{vary: on}))
        rest = [w - d for w, d in zip(walls, devices, strict=True)]
        print(f"{vary} {'on ' if on else 'off'}: a draft step of k={k}, medians over {len(walls)}: "
              f"wall {statistics.median(walls) * 1e3:.2f} ms, device {statistics.median(devices) * 1e3:.2f} ms, "
              f"rest {statistics.median(rest) * 1e3:.2f} ms", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specserve.bench.experiments.step_overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo", default="demo", help="a zoo preset name or directory (default: %(default)s)")
    parser.add_argument("--k", type=int, default=5, help="draft tokens per step (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=200, help="draft steps per round (default: %(default)s)")
    parser.add_argument("--vary", choices=("back_to_back", "compiled"), default="back_to_back",
                        help="the batching setting turned on and off (default: %(default)s)")
    args = parser.parse_args(argv)
    report(ensure_zoo(args.zoo), args.k, args.steps, args.vary)


if __name__ == "__main__":
    main()
