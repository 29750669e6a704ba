"""Workload-aware routing against one general draft, and the adaptive-k schedules, through the service.

For each k schedule (fixed, heuristic, confidence) the service starts on the zoo and warms its
policy up with held-out prompts that name no task. Then, for every held-out prompt of every task,
three greedy requests run back to back so machine noise hits them alike:

    routed    no task, no draft, no k: classifier, policy (draft, k, fallback), adaptive k
    general   the task named, the general draft forced (the policy still picks its k)
    off       the target alone

and every output is checked token for token against `off`. Prints per task: how the prompts were
classified, which drafts served them, alpha routed vs general (alpha over the requests that drafted),
and both speedups over `off` in tokens per second. All ratios come from this run.

    .venv/bin/python bench/routing.py --zoo /tmp/zoo-bench [--prompts 8] [--warm-up 6] [--max-tokens 96]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from transformers.utils import logging as hf_logging

from specserve.cluster.bringup import start_service
from specserve.cluster.client import SpecServeClient
from specserve.cluster.local import open_zoo
from specserve.proto.v1 import specserve_pb2 as pb
from specserve.cluster.zoo.presets import GENERAL_DRAFT
from specserve.workers.stats import alpha

MODES = ("routed", "general", "off")
SCHEDULES = ("fixed", "heuristic", "confidence")


@dataclass
class Totals:
    tokens: int = 0
    seconds: float = 0.0
    accepted: int = 0
    rejections: int = 0
    drafted_requests: int = 0
    requests: int = 0
    drafts: Counter = field(default_factory=Counter)  # served by ("" = target-only)
    resolved: Counter = field(default_factory=Counter)  # task the router resolved

    def add(self, response: pb.GenerateResponse, seconds: float) -> None:
        s = response.stats
        self.tokens += len(response.token_ids)
        self.seconds += seconds
        self.requests += 1
        self.drafts[s.draft] += 1
        self.resolved[s.task] += 1
        if s.proposed_tokens:
            self.drafted_requests += 1
            self.accepted += s.accepted_tokens
            self.rejections += s.rejections

    @property
    def alpha(self) -> float:
        return alpha(self.accepted, self.rejections) if self.accepted + self.rejections else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", default="demo", help="zoo preset or directory (default: %(default)s)")
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts per task (default: %(default)s)")
    parser.add_argument("--warm-up", type=int, default=6,
                        help="routed requests per task before measuring (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=96, help="(default: %(default)s)")
    parser.add_argument("--schedules", default=",".join(SCHEDULES), help="(default: %(default)s)")
    args = parser.parse_args()
    hf_logging.disable_progress_bar()
    zoo = open_zoo(args.zoo)
    for schedule in args.schedules.split(","):
        results, stats = run(zoo, schedule, args)
        report(zoo, schedule, results, stats)


def run(zoo, schedule: str, args) -> tuple[dict[str, dict[str, Totals]], pb.ServiceStats]:
    service = start_service(port=0, overrides={"models": {"zoo": str(zoo.root)},
                                               "router": {"policy": {"k_schedule": schedule}}})
    client = SpecServeClient(service.address)
    try:
        for task in zoo.tasks:  # the policy learns from traffic like any other
            for prompt in zoo.prompts(task)[-args.warm_up:]:
                client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=args.max_tokens))
        results: dict[str, dict[str, Totals]] = defaultdict(lambda: {mode: Totals() for mode in MODES})
        for task in zoo.tasks:
            for i, prompt in enumerate(zoo.prompts(task)[: args.prompts]):
                requests = {
                    "routed": pb.GenerateRequest(prompt=prompt, max_tokens=args.max_tokens),
                    "general": pb.GenerateRequest(prompt=prompt, max_tokens=args.max_tokens, task=task,
                                                  draft=GENERAL_DRAFT, speculation=pb.SPECULATION_ON),
                    "off": pb.GenerateRequest(prompt=prompt, max_tokens=args.max_tokens, task=task,
                                              speculation=pb.SPECULATION_OFF),
                }
                order = MODES[i % 3:] + MODES[: i % 3]  # rotate who goes first
                outputs = {}
                for mode in order:
                    start = time.perf_counter()
                    response = client.generate(requests[mode])
                    results[task][mode].add(response, time.perf_counter() - start)
                    outputs[mode] = list(response.token_ids)
                for mode in ("routed", "general"):
                    assert outputs[mode] == outputs["off"], f"{task} prompt {i}: {mode} output differs from the target's"
        return results, client.stats()
    finally:
        client.close()
        service.stop()


def report(zoo, schedule: str, results: dict[str, dict[str, Totals]], stats: pb.ServiceStats) -> None:
    print(f"\nk schedule: {schedule}  (zoo {zoo.root}; greedy; every output identical to the target's)")
    print(f"{'task':<6} {'classified':>10} {'served by (routed)':<34} {'alpha routed':>12} {'alpha general':>13} "
          f"{'gain':>6} {'speedup routed':>14} {'speedup general':>15}")
    for task, modes in results.items():
        routed, general, off = modes["routed"], modes["general"], modes["off"]
        served = ", ".join(f"{d or 'target-only'} {n}" for d, n in routed.drafts.most_common())
        classified = routed.resolved[task] / routed.requests
        print(f"{task:<6} {classified:>10.0%} {served:<34} {routed.alpha:>12.3f} {general.alpha:>13.3f} "
              f"{routed.alpha - general.alpha:>+6.3f} {routed.tokens_per_second / off.tokens_per_second:>13.2f}x "
              f"{general.tokens_per_second / off.tokens_per_second:>14.2f}x")
    print("policy at the end (task row, then its drafts: alpha, c, k, expected speedup, decision):")
    for t in stats.tasks:
        name = f"{t.task}/{t.draft}" if t.draft else t.task
        print(f"  {name:<16} alpha {t.alpha:.2f} c {t.cost_ratio:.2f} k {t.k:>2} speedup {t.expected_speedup:.2f} "
              f"scored {t.scored_tokens:>5}  {t.decision}{': ' + t.reason if t.reason else ''}")


if __name__ == "__main__":
    main()
