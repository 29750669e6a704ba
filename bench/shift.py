"""Shift: one task's traffic moves to another corpus, and the service catches up, every step timed.

1. **the head of the old traffic**: the service serves one task, ``assist``, with draft ``eagle3``
   and keeps a traffic sample of every request; ``--before`` prompts (the zoo's held-out documents'
   first lines) until the sample holds ``--sample-requests``; ``specserve distill --method eagle3
   --sample`` makes a head of them (the phase's entries of the sample), swapped in (``specserve swap-draft``). A real Prometheus scrapes the
   service, evaluating specserve's alert rules (deploy/alerts/specserve-rules.yaml) with every window
   and ``for`` divided by ``--time-scale`` (120: the 6-hour baseline becomes 3 minutes, 15 minutes 8 s).
2. **before**: other ``--before`` prompts for ``--before-seconds``; alpha measured from the replies.
3. **shift**: the traffic becomes ``--after`` prompts; alpha falls, SpecServeAcceptanceBelowBaseline
   fires (as Prometheus evaluates it), and the traffic goes on until the sample holds
   ``--sample-requests`` of it.
4. **re-distilled**: the same distill on the shifted requests only (the sample's entries since the
   shift). Traffic pauses while a head distills: on two cores, training and serving at once would
   time each other.
5. **canary**: the new head beside the old one on half of the task's traffic (``specserve canary``: a
   look every 10 requests per arm, 95% confidence) until it is promoted or rolled back.
6. **after**: ``--after`` prompts the new head was not trained on, for ``--after-seconds``; alpha again.

Every reply is greedy and compared token for token with its prompt's target-only output. The goal
(issue 44): the alert fires, and alpha after is within 0.05 of alpha before (or above it), with no
request lost or changed. Not part of the tests (minutes): ``make shift`` or ``python -m
specserve.bench.shift``.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ray import serve

from specserve.cluster.app import CONTROL_DEPLOYMENT
from specserve.cluster.bringup import start_service
from specserve.cluster.client import SpecServeClient
from specserve.cluster.kuberay import ALERT_RULES
from specserve.cluster.local import open_or_build_zoo
from specserve.proto.v1 import specserve_pb2 as pb
from specserve.router.canary import FINISHED, CanaryConfig
from specserve.router.traffic_sample import SUFFIX
from specserve.workers.stats import alpha

from .prometheus import Prometheus, scaled_rules
from .settings import RESULTS_DIR

TASK = "assist"  # the one task whose traffic shifts
DRAFT = "eagle3"
ALERT = "SpecServeAcceptanceBelowBaseline"
CANARY = CanaryConfig(share=0.5, confidence=0.95, min_requests=10, max_requests=200)
K = 3  # the heads' training-time-test steps: every phase drafts as far
ALERT_POLL_SECONDS = 1.0


@dataclass
class Phase:
    """One stretch of traffic: its replies' acceptance, and what went wrong."""

    name: str
    started: float
    ended: float = 0.0
    requests: int = 0
    accepted: int = 0
    rejections: int = 0
    by_draft: dict[str, list[int]] = field(default_factory=dict)  # draft -> [requests, accepted, rejections]
    replies: list[tuple[str, list[int]]] = field(default_factory=list)  # (prompt, token ids)
    failed: int = 0

    @property
    def alpha(self) -> float:
        return alpha(self.accepted, self.rejections)

    def add(self, prompt: str, reply: pb.GenerateResponse) -> None:
        s = reply.stats
        self.requests += 1
        self.accepted += s.accepted_tokens
        self.rejections += s.rejections
        row = self.by_draft.setdefault(s.draft or "-", [0, 0, 0])
        row[0], row[1], row[2] = row[0] + 1, row[1] + s.accepted_tokens, row[2] + s.rejections
        self.replies.append((prompt, list(reply.token_ids)))

    def summary(self, t0: float) -> dict:
        return {"phase": self.name, "from_s": round(self.started - t0, 1), "to_s": round(self.ended - t0, 1),
                "requests": self.requests, "failed": self.failed, "alpha": round(self.alpha, 4),
                "by_draft": {d: {"requests": r, "alpha": round(alpha(a, j), 4)} for d, (r, a, j) in self.by_draft.items()}}


class Traffic:
    """``clients`` threads sending greedy requests of TASK, drafting with DRAFT at k = K, from a
    list of prompts the caller changes between phases."""

    def __init__(self, client: SpecServeClient, clients: int, max_tokens: int, seed: int) -> None:
        self.client, self.clients, self.max_tokens = client, clients, max_tokens
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def run(self, phase: Phase, prompts: list[str], until) -> Phase:
        """Send ``prompts`` (drawn at random) until ``until()`` is true; the phase's counts."""
        def one() -> None:
            while not until():
                with self.lock:
                    prompt = self.rng.choice(prompts)
                try:
                    reply = self.client.generate(pb.GenerateRequest(
                        prompt=prompt, task=TASK, draft=DRAFT, k=K, max_tokens=self.max_tokens,
                        speculation=pb.SPECULATION_ON), timeout=120)
                except Exception as exc:  # counted; the run goes on (the report says how many)
                    print(f"    request failed: {exc}", flush=True)
                    with self.lock:
                        phase.failed += 1
                    continue
                with self.lock:
                    phase.add(prompt, reply)

        with ThreadPoolExecutor(self.clients) as pool:
            for future in [pool.submit(one) for _ in range(self.clients)]:
                future.result()
        phase.ended = time.monotonic()
        return phase


def corpus_prompts(zoo, task: str) -> list[str]:
    """The first line of each held-out document of the zoo's corpus of ``task`` (its question,
    comment or signature), a prompt the target continues as its corpus goes on."""
    documents = json.loads((zoo.root / "corpora" / f"{task}.json").read_text())["held_out"]
    prompts = [d.split("\n", 1)[0].strip() + "\n" for d in documents]
    return list(dict.fromkeys(p for p in prompts if len(p) > 8))


def halves(prompts: list[str], most: int, seed: int) -> tuple[list[str], list[str]]:
    """The prompts shuffled, in two halves of at most ``most`` each."""
    prompts = list(prompts)
    random.Random(seed).shuffle(prompts)
    middle = len(prompts) // 2
    return prompts[:middle][:most], prompts[middle:][:most]


def since(sample: Path, start: float, out: Path) -> Path:
    """A copy of the sample's TASK requests kept from ``start`` (unix seconds) on: a phase's own.
    (`distill --sample-hours` counts back from when its process starts, seconds after the phase.)"""
    (out / TASK).mkdir(parents=True, exist_ok=True)
    lines = [line for path in sorted((sample / TASK).glob(f"*{SUFFIX}"))
             for line in path.read_text(encoding="utf-8").splitlines() if json.loads(line)["time"] >= start]
    (out / TASK / f"phase{SUFFIX}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def distill(target: Path, out: Path, steps: int, tokens: int, sample: Path) -> dict:
    """`specserve distill --method eagle3 --sample` in a process of its own (as an operator runs it)."""
    command = [sys.executable, "-m", "specserve.cluster.cli", "distill", "--method", "eagle3", "--target",
               str(target), "--out", str(out), "--steps", str(steps), "--tokens", str(tokens), "--sample",
               str(sample), "--task", TASK]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    print("    " + done.stderr.strip().splitlines()[-1], flush=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


class AlertWatch:
    """Prometheus's alerts, read every ALERT_POLL_SECONDS from a thread: when ALERT went pending,
    firing and (once firing) away, for TASK's draft."""

    def __init__(self, prometheus: Prometheus) -> None:
        self.prometheus = prometheus
        self.seen: dict[str, float] = {}  # pending / firing / resolved -> when first seen (monotonic)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(ALERT_POLL_SECONDS):
            try:
                states = {a["state"] for a in self.prometheus.alerts()
                          if a["labels"].get("alertname") == ALERT and a["labels"].get("task") == TASK}
            except OSError:
                continue
            for state in states:
                self.seen.setdefault(state, time.monotonic())
            if "firing" in self.seen and "firing" not in states:
                self.seen.setdefault("resolved", time.monotonic())

    def reset(self) -> None:
        self.seen = {}

    def stop(self) -> None:
        self._stop.set()


def shift(args: argparse.Namespace) -> dict:
    zoo = open_or_build_zoo(args.zoo)
    work = args.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    # Each corpus's prompts in two halves: the heads train on the traffic of the first, the phases
    # that measure them serve the second.
    (old_sampled, old_unseen), (shifted, unseen) = (halves(corpus_prompts(zoo, task), args.prompts, args.seed)
                                                    for task in (args.before, args.after))
    t0 = time.monotonic()
    timeline: list[tuple[float, str]] = []

    def step(what: str) -> None:
        timeline.append((time.monotonic() - t0, what))
        print(f"[{time.monotonic() - t0:7.1f} s] {what}", flush=True)

    sample = work / "sample"
    metrics_port = args.metrics_port
    overrides = {"models": {"zoo": str(zoo.root)},
                 "router": {"tasks": {TASK: [DRAFT]}, "as_written": [TASK],
                            "traffic_sample": {"dir": str(sample), "share": 1.0, "flush_seconds": 2.0,
                                               "max_per_task": 100_000}}}
    step("starting the service")
    service = start_service(port=0, overrides=overrides, metrics_port=metrics_port)
    client = SpecServeClient(service.address)
    control = serve.get_deployment_handle(CONTROL_DEPLOYMENT, app_name=service.app_name)
    rules = scaled_rules(ALERT_RULES, work / "rules.yaml", args.time_scale)
    try:
        with Prometheus(work / "prometheus", metrics_port, args.prometheus_port, rules=(rules,)) as prometheus:
            watch = AlertWatch(prometheus)
            traffic = Traffic(client, args.clients, args.max_tokens, args.seed)
            phases = []

            def sampled_then_distilled(name: str, prompts: list[str], out: Path, until=lambda: True) -> dict:
                """``prompts`` until the sample holds ``--sample-requests`` of them (and ``until()``),
                then a head distilled from those requests alone."""
                started = time.time()
                phase = Phase(name, time.monotonic())
                phases.append(traffic.run(phase, prompts, lambda: phase.requests >= args.sample_requests and until()))
                step(f"{name}: alpha {phase.alpha:.3f} over {phase.requests} requests")
                time.sleep(3.0)  # the routers' last flush of the sample (every 2 s)
                step(f"distilling a head from the sample of the {name} requests (traffic paused)")
                own = since(sample, started, work / f"sample-{out.name}")
                return distill(zoo.target_dir, out, args.steps, args.tokens, own)

            step(f"{args.before} traffic with the zoo's head, kept in the traffic sample")
            old = work / "head-old"
            old_facts = sampled_then_distilled(f"{args.before} traffic", old_sampled, old)
            control.swap_draft.remote(DRAFT, str(old)).result(timeout_s=300)
            step(f"serving the head of the {args.before} traffic as draft {DRAFT} for task {TASK}")
            step(f"before: unseen {args.before} prompts for {args.before_seconds:.0f} s")
            deadline = time.monotonic() + args.before_seconds
            phases.append(traffic.run(Phase("before", time.monotonic()), old_unseen,
                                      lambda: time.monotonic() > deadline))
            step(f"before: alpha {phases[-1].alpha:.3f} over {phases[-1].requests} requests")
            step(f"shift: {args.after} prompts until {ALERT} fires and the sample holds {args.sample_requests} "
                 f"of them (at most {args.alert_timeout:.0f} s)")
            deadline = time.monotonic() + args.alert_timeout
            watch.reset()  # what fires from here on is the shift's
            fresh = work / "head-shifted"
            new_facts = sampled_then_distilled("shifted", shifted, fresh,
                                               lambda: "firing" in watch.seen or time.monotonic() > deadline)
            fired = watch.seen.get("firing")
            step(f"{ALERT} " + (f"fired at {fired - t0:.1f} s" if fired else f"did not fire in {args.alert_timeout:.0f} s"))
            step(f"canary: the re-distilled head on {CANARY.share:.0%} of {TASK}'s traffic")
            status = control.start_canary.remote(DRAFT, str(fresh), "shifted", (TASK,), CANARY).result(timeout_s=300)
            phase = Phase("canary", time.monotonic())

            read = [0.0]  # when the status was last read: once a second, whichever client asks

            def decided() -> bool:
                nonlocal status
                with traffic.lock:
                    if time.monotonic() - read[0] >= ALERT_POLL_SECONDS:
                        read[0] = time.monotonic()
                        status = next(s for s in control.canary_statuses.remote().result(timeout_s=30)
                                      if s.canary_id == status.canary_id)
                    return status.state in FINISHED

            phases.append(traffic.run(phase, unseen, decided))
            step(f"canary {status.state} ({status.reason}): alpha {status.canary.alpha:.3f} on "
                 f"{status.canary.requests} requests vs {status.base.alpha:.3f} on {status.base.requests}")
            step(f"after: unseen {args.after} prompts for {args.after_seconds:.0f} s")
            deadline = time.monotonic() + args.after_seconds
            phases.append(traffic.run(Phase("after", time.monotonic()), unseen, lambda: time.monotonic() > deadline))
            step(f"after: alpha {phases[-1].alpha:.3f} over {phases[-1].requests} requests")
            watch.stop()
        step("checking every reply against the target alone")
        changed, checked = _check(client, phases, args.max_tokens)
        step(f"{checked} replies checked: {changed} differ from the target alone")
    finally:
        client.close()
        service.stop()
    alphas = {p.name: p.alpha for p in phases}
    return {"zoo": str(zoo.root), "task": TASK, "before": args.before, "after": args.after,
            "time_scale": args.time_scale, "canary_config": asdict(CANARY),
            "old_head": old_facts, "shifted_head": new_facts,
            "phases": [p.summary(t0) for p in phases],
            "alert": {state: round(when - t0, 1) for state, when in watch.seen.items()},
            "canary": {"state": status.state, "reason": status.reason, "looks": status.looks,
                       "alpha_canary": round(status.canary.alpha, 4), "alpha_base": round(status.base.alpha, 4),
                       "requests": [status.canary.requests, status.base.requests]},
            "timeline": [{"t_s": round(t, 1), "step": what} for t, what in timeline],
            "recovered_within": round(alphas["before"] - alphas["after"], 4),
            "goal_met": "firing" in watch.seen and alphas["after"] >= alphas["before"] - 0.05 and changed == 0
            and not any(p.failed for p in phases),
            "replies_checked": checked, "replies_changed": changed, "failed": sum(p.failed for p in phases)}


def _check(client: SpecServeClient, phases: list[Phase], max_tokens: int) -> tuple[int, int]:
    """Every reply against its prompt's target-only output: (how many differ, how many checked)."""
    reference: dict[str, list[int]] = {}
    changed = checked = 0
    for phase in phases:
        for prompt, tokens in phase.replies:
            if prompt not in reference:
                reference[prompt] = list(client.generate(pb.GenerateRequest(
                    prompt=prompt, task=TASK, max_tokens=max_tokens, speculation=pb.SPECULATION_OFF),
                    timeout=120).token_ids)
            checked += 1
            changed += tokens != reference[prompt]
    return changed, checked


def timeline_markdown(report: dict) -> str:
    lines = [f"# Shift: {report['before']} -> {report['after']} on task {report['task']} ({report['zoo']})", "",
             f"Alert windows divided by {report['time_scale']:g}. Goal: alpha after within 0.05 of before, "
             f"nothing lost or changed: **{'met' if report['goal_met'] else 'missed'}**.", "",
             "| t (s) | step |", "|---:|---|"]
    lines += [f"| {row['t_s']:.1f} | {row['step']} |" for row in report["timeline"]]
    lines += ["", "| phase | from (s) | to (s) | requests | failed | alpha | by draft |", "|---|---:|---:|---:|---:|---:|---|"]
    for p in report["phases"]:
        drafts = ", ".join(f"{d}: {v['alpha']:.3f} ({v['requests']})" for d, v in p["by_draft"].items())
        lines.append(f"| {p['phase']} | {p['from_s']} | {p['to_s']} | {p['requests']} | {p['failed']} | "
                     f"{p['alpha']:.3f} | {drafts} |")
    lines += ["", f"Alert {ALERT}: " + (", ".join(f"{s} at {t} s" for s, t in report["alert"].items()) or "never"),
              f"Replies checked against the target alone: {report['replies_checked']}, changed: "
              f"{report['replies_changed']}, failed: {report['failed']}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specserve shift", description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", default="demo", help="zoo preset or directory (default: %(default)s, built if missing)")
    parser.add_argument("--before", default="sql", help="the corpus of the traffic before (default: %(default)s)")
    parser.add_argument("--after", default="math", help="the corpus of the traffic after (default: %(default)s)")
    parser.add_argument("--before-seconds", type=float, default=90.0, help="(default: %(default)s)")
    parser.add_argument("--after-seconds", type=float, default=60.0, help="(default: %(default)s)")
    parser.add_argument("--sample-requests", type=int, default=200,
                        help="shifted requests sampled before re-distilling (default: %(default)s)")
    parser.add_argument("--alert-timeout", type=float, default=300.0, help="(default: %(default)s)")
    parser.add_argument("--time-scale", type=float, default=120.0,
                        help="the alert rules' windows divided by this (default: %(default)s)")
    parser.add_argument("--prompts", type=int, default=60, help="distinct prompts per phase (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=160, help="distill steps per head (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=64_000, help="distill tokens per head (default: %(default)s)")
    parser.add_argument("--clients", type=int, default=4, help="(default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=64, help="(default: %(default)s)")
    parser.add_argument("--metrics-port", type=int, default=18095, help="Ray's metrics export port (default: %(default)s)")
    parser.add_argument("--prometheus-port", type=int, default=19095, help="(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    parser.add_argument("--out", type=Path, help="results directory (default: bench/results/<time>-shift)")
    args = parser.parse_args(argv)
    args.out = args.out or RESULTS_DIR / (datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S") + "-shift")
    report = shift(args)
    (args.out / "shift.json").write_text(json.dumps(report, indent=2))
    (args.out / "shift.md").write_text(timeline_markdown(report))
    print(timeline_markdown(report))
    return 0 if report["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
