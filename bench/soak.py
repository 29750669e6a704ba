"""Soak: minutes of mixed traffic while workers are killed and frozen at random.

Clients stream greedy and sampled requests over every task, with and without speculation; every
``--fault-every`` seconds one fault strikes (a draft worker or the target replica killed with Ray's
API, one frozen for a while, a draft worker killed for good). Speculative requests are drafted by
the draft workers (the draft-free proposers are off unless ``--set 'router.draft_free=[...]'``), so a
draft worker's fault meets sessions. At the end the service is left to drain, and the report says:

- requests completed, and failed by gRPC status;
- tokens lost: greedy outputs are compared token for token with the same prompt's target-only output
  taken before the soak, so a lost, repeated or changed token counts (it must be 0);
- the faults injected (each with its victim and the sessions it held: a worker that held none
  tests no recovery), and how many requests carried on through one (resumed, draft reopened);
- requests by what served them (a draft, a draft-free proposer, "" for target-only), and the
  first failed ones with what their client was told;
- memory per component over time, and whether sessions, KV reservations and queued requests went
  back to zero once the load stopped.

Not part of the tests (it runs for minutes): ``make soak`` or ``specserve soak``.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from specserve.cluster.bringup import merge_into, start_service
from specserve.cluster.client import SpecServeClient
from specserve.cluster.local import open_or_build_zoo
from specserve.proto.v1 import specserve_pb2 as pb

from . import faults
from .cli import sim_arguments, workload_overrides
from .memory import resident_memory

FAULTS = ("kill draft", "kill draft for good", "kill target", "freeze draft", "freeze target")
FREEZE_SECONDS = 8.0  # past the draft step timeout; past the target's too, with the soak's timeouts
# Short enough that a frozen target is noticed within a fault period; a replacement replica takes
# ~20 s to start on this machine, hence the long wait.
SOAK_TIMEOUTS = {"draft_step_seconds": 2.0, "target_step_seconds": 5.0, "target_wait_seconds": 90.0}


@dataclass
class Tally:
    """What the clients saw; updated from several threads under ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    statuses: Counter = field(default_factory=Counter)
    tokens: int = 0
    tokens_lost: int = 0
    greedy_checked: int = 0
    resumed: int = 0
    draft_reopened: int = 0
    by_draft: Counter = field(default_factory=Counter)  # what served each request ("": target-only)
    lost_examples: list = field(default_factory=list)
    failed_examples: list = field(default_factory=list)  # the first few failed requests: what the client was told

    def record(self, status: str, tokens: list[int], stats: pb.GenerateStats | None, expected: list[int] | None,
               details: str = ""):
        with self.lock:
            self.statuses[status] += 1
            if status != "OK" and len(self.failed_examples) < 5:
                self.failed_examples.append({"status": status, "details": details, "tokens_before": len(tokens)})
            self.tokens += len(tokens)
            if stats is not None:
                self.resumed += stats.target_resumes > 0
                self.draft_reopened += stats.draft_reopens > 0
                self.by_draft[stats.draft] += 1
            if status == "OK" and expected is not None:
                self.greedy_checked += 1
                lost = sum(a != b for a, b in zip(tokens, expected)) + abs(len(tokens) - len(expected))
                self.tokens_lost += lost
                if lost and len(self.lost_examples) < 3:
                    self.lost_examples.append({"got": tokens, "expected": expected})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specserve soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", default="tiny", help="zoo preset or directory (default: %(default)s, built if missing)")
    parser.add_argument("--minutes", type=float, default=5.0, help="how long the load runs (default: %(default)s)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients (default: %(default)s)")
    parser.add_argument("--fault-every", type=float, default=20.0, help="seconds between faults (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=64, help="(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="for the choice of prompts and faults (default: %(default)s)")
    parser.add_argument("--out", type=Path, help="also write the report as JSON here")
    sim_arguments(parser)  # a fleet on simulated devices: --sim h100-70b --set target.replicas=4
    args = parser.parse_args(argv)
    report = soak(args)
    print(json.dumps({k: v for k, v in report.items() if k != "memory"}, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0 if report["tokens_lost"] == 0 else 1


def soak(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    zoo = open_or_build_zoo(args.zoo)
    prompts = [(task, p) for task in zoo.tasks for p in zoo.prompts(task)[:4]]
    # No draft-free proposers unless --set brings them back: with them, prompt lookup served most
    # speculative requests (n-gram 63%, draft workers ~2%) and a draft worker's kill hit no session.
    overrides = {"models": {"zoo": str(zoo.root)}, "router": {"timeouts": SOAK_TIMEOUTS, "draft_free": []}}
    merge_into(overrides, workload_overrides(args))
    service = start_service(port=0, overrides=overrides)
    client = SpecServeClient(service.address)
    try:
        print(f"soak: {len(prompts)} prompts; target-only references first", flush=True)
        reference = {p: list(client.generate(_request(task, p, args.max_tokens, pb.SPECULATION_OFF)).token_ids)
                     for task, p in prompts}
        tally, memory, injected = Tally(), [], []
        stop = threading.Event()
        threads = [threading.Thread(target=_client_loop, args=(client, prompts, reference, args, tally, stop,
                                                               random.Random(rng.random())), daemon=True)
                   for _ in range(args.clients)]
        threads.append(threading.Thread(target=_fault_loop, args=(client, args.fault_every, injected, stop, rng),
                                        daemon=True))
        for t in threads:
            t.start()
        started = time.monotonic()
        while time.monotonic() - started < args.minutes * 60:
            memory.append(_memory_sample(time.monotonic() - started))
            with tally.lock:
                done = sum(tally.statuses.values())
            print(f"  {memory[-1]['t']:6.0f} s  requests {done:5d}  lost tokens {tally.tokens_lost}  "
                  f"faults {len(injected)}  RSS MiB {memory[-1]['rss_mib']}", flush=True)
            stop.wait(10)
        stop.set()
        for t in threads:
            t.join(timeout=180)
        at_rest = _drain(client)
        memory.append(_memory_sample(time.monotonic() - started))
        return {"minutes": args.minutes, "clients": args.clients, "sim": args.sim, "overrides": args.overrides,
                "requests": sum(tally.statuses.values()),
                "by_status": dict(tally.statuses), "tokens_streamed": tally.tokens,
                "greedy_checked": tally.greedy_checked, "tokens_lost": tally.tokens_lost,
                "requests_resumed_on_another_target": tally.resumed,
                "requests_with_a_reopened_draft": tally.draft_reopened, "requests_by_draft": dict(tally.by_draft),
                "faults": injected, "at_rest": at_rest,
                "rss_mib_first_last": {k: (memory[0]["rss_mib"].get(k), memory[-1]["rss_mib"].get(k))
                                       for k in memory[-1]["rss_mib"]},
                "lost_examples": tally.lost_examples, "failed_examples": tally.failed_examples, "memory": memory}
    finally:
        client.close()
        service.stop()


def _client_loop(client, prompts, reference, args, tally: Tally, stop: threading.Event, rng: random.Random):
    while not stop.is_set():
        task, prompt = rng.choice(prompts)
        greedy = rng.random() < 0.75
        mode = rng.choice([pb.SPECULATION_AUTO, pb.SPECULATION_ON, pb.SPECULATION_OFF])
        request = _request(task, prompt, args.max_tokens, mode, temperature=0.0 if greedy else 0.8)
        tokens, stats, status, details = [], None, "OK", ""
        try:
            for chunk in client.stream(request, timeout=180):
                tokens.extend(chunk.token_ids)
                stats = chunk.stats if chunk.HasField("stats") else stats
        except grpc.RpcError as exc:
            status, details = exc.code().name, exc.details() or ""
        tally.record(status, tokens, stats, reference[prompt] if greedy else None, details)


def _fault_loop(client, every: float, injected: list, stop: threading.Event, rng: random.Random):
    started = time.monotonic()
    while not stop.wait(every):
        fault = rng.choice(FAULTS)
        try:
            victim = _inject(client, fault)
            injected.append({"t": round(time.monotonic() - started), "fault": fault, **victim})
        except Exception as exc:  # a worker still restarting from the last fault: note it, go on
            injected.append({"t": round(time.monotonic() - started), "fault": fault, "skipped": str(exc)})


def _inject(client, fault: str) -> dict:
    """Strike ``fault`` at a worker holding a session if one does (else the first): which, and the
    sessions it held, for the report (a kill of a worker that held none tests no recovery)."""
    kind = "target" if "target" in fault else "draft"
    candidates = faults.workers(client, kind)
    victim = faults.holding_a_session(candidates) or (candidates[0] if candidates else None)
    if victim is None:
        raise LookupError(f"no {kind} worker registered")
    struck = {"worker": victim.worker_id, "sessions": faults.inspect(kind, victim.address).live_sessions}
    if fault.startswith("freeze"):
        faults.freeze(victim.pid)
        time.sleep(FREEZE_SECONDS)
        faults.thaw(victim.pid)
    else:
        faults.kill(victim, restart=fault != "kill draft for good")
    return struck


def _drain(client, timeout: float = 180.0) -> dict:
    """Wait for the load to leave no trace: the state once it has, or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        stats = client.stats()
        held, silent = {}, []
        for w in stats.workers:
            try:
                state = faults.inspect(w.kind, w.address)
                held[w.worker_id] = {"sessions": state.live_sessions, "kv_reserved_bytes": state.kv_reserved_bytes}
            except grpc.RpcError:
                silent.append(w.worker_id)  # a dead worker's entry until the registry drops it
        busy = stats.requests_in_flight or stats.requests_queued or any(any(v.values()) for v in held.values())
        if not busy or time.monotonic() > deadline:
            # A registered worker that does not answer (killed late: its entry not dropped yet, or
            # restarting and compiling its passes) holds nothing; the report names it, not omits it.
            return {"requests_in_flight": stats.requests_in_flight, "requests_queued": stats.requests_queued,
                    "workers": held, "registered_not_answering": silent, "drained": not busy}
        time.sleep(1)


def _memory_sample(t: float) -> dict:
    rss = Counter()
    for row in resident_memory(own_cluster=True):
        rss[row["component"]] += row["rss_bytes"]
    return {"t": round(t), "rss_mib": {k: round(v / 2**20) for k, v in sorted(rss.items())}}


def _request(task: str, prompt: str, max_tokens: int, mode, temperature: float = 0.0) -> pb.GenerateRequest:
    return pb.GenerateRequest(prompt=prompt, task=task, max_tokens=max_tokens, speculation=mode,
                              temperature=temperature, top_p=1.0)


if __name__ == "__main__":
    raise SystemExit(main())
