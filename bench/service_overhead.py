"""The cost of distribution: the service against the in-process engine, same models, prompts and k.

For every held-out prompt of every task, four greedy decodes run back to back, so machine noise hits
all four alike: in-process target-only, in-process speculative, service with speculation OFF,
service ON. Cores: the in-process engine runs on one thread pinned to core 0, as the service's
target replica is (deploy/serve_config.yaml); the service's draft workers run on core 1, and the
router is unpinned. Prints tokens/s per path, the service's overhead and both speedups.

    .venv/bin/python bench/service_overhead.py --zoo /tmp/zoo-bench [--prompts 6] [--max-tokens 96] [--k 4]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from transformers.utils import logging as hf_logging

from specserve.cluster.bringup import start_service
from specserve.cluster.client import SpecServeClient
from specserve.cluster.demo import engine_decoder, service_decoder
from specserve.cluster.local import open_zoo, zoo_engine
from specserve.workers.grpc_host import Device

PATHS = ("engine off", "engine on", "service off", "service on")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", default="demo", help="zoo preset or directory (default: %(default)s)")
    parser.add_argument("--prompts", type=int, default=6, help="held-out prompts per task (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=96, help="(default: %(default)s)")
    parser.add_argument("--k", type=int, default=4, help="(default: %(default)s)")
    args = parser.parse_args()
    hf_logging.disable_progress_bar()

    zoo = open_zoo(args.zoo)
    device = Device(threads=1, cpus=(0,))  # the in-process engine's core, the target replica's too
    engine = device.executor.submit(zoo_engine, zoo, zoo.draft_names, 1).result()
    in_process = engine_decoder(engine, args.max_tokens, args.k)
    service = start_service(port=0, overrides={"models": {"zoo": str(zoo.root)}})
    client = SpecServeClient(service.address)
    remote = service_decoder(client, args.max_tokens, args.k)
    try:
        rows = {task: measure(task, zoo, in_process, remote, device, args.prompts) for task in ["(warm-up)", *zoo.tasks]}
    finally:
        client.close()
        service.stop()
    del rows["(warm-up)"]
    print_table(rows, zoo, args)


def measure(task: str, zoo, in_process, remote, device: Device, prompts: int) -> dict[str, list[float]]:
    """Per path: [tokens, seconds] summed over the prompts; every output checked against target-only."""
    real_task = zoo.tasks[0] if task.startswith("(") else task
    draft = zoo.default_draft(real_task)
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for prompt in zoo.prompts(real_task)[: 1 if task.startswith("(") else prompts]:
        outputs = {}
        for path in PATHS:
            use = draft if path.endswith("on") else None
            if path.startswith("engine"):
                ids, seconds, _ = device.executor.submit(in_process, prompt, real_task, use).result()
            else:
                ids, seconds, _ = remote(prompt, real_task, use)
            outputs[path] = ids
            totals[path][0] += len(ids)
            totals[path][1] += seconds
        assert len({tuple(ids) for ids in outputs.values()}) == 1, f"{task}: outputs differ between paths"
    return totals


def print_table(rows: dict[str, dict[str, list[float]]], zoo, args) -> None:
    print(f"zoo {zoo.manifest['preset']} ({zoo.root}); greedy, k={args.k}, {args.max_tokens} tokens, "
          f"{args.prompts} prompts per task; outputs identical on all four paths")
    header = (f"{'task':<6}" + "".join(f"{p + ' tok/s':>17}" for p in PATHS)
              + f"{'overhead off':>13}{'overhead on':>12}{'engine x':>9}{'service x':>10}{'svc/eng x':>10}")
    print(header + "\n" + "-" * len(header))
    for task, totals in rows.items():
        rate = {path: totals[path][0] / totals[path][1] for path in PATHS}
        engine_x = rate["engine on"] / rate["engine off"]
        service_x = rate["service on"] / rate["service off"]
        print(f"{task:<6}" + "".join(f"{rate[p]:>17.1f}" for p in PATHS)
              + f"{1 - rate['service off'] / rate['engine off']:>12.1%} {1 - rate['service on'] / rate['engine on']:>11.1%}"
              + f"{engine_x:>8.2f}x{service_x:>9.2f}x{service_x / engine_x:>9.2f}x")
    print("overhead: 1 - service tok/s / in-process tok/s (goal <= 15%); engine x / service x: speculative over "
          "target-only in each; svc/eng x: the service's speedup over the engine's (goal >= 0.85)")


if __name__ == "__main__":
    main()
