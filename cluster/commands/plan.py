"""`specserve plan`: how many target replicas and draft workers a workload needs (``cluster/plan.py``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import yaml

from specserve.proto.v1 import specserve_pb2 as pb

from ..client import SpecServeClient
from ..plan import DRAFT_FREE, VALIDATED_SESSIONS, Costs, Fleet, TaskLoad, Workload, plan, served_arm

DESCRIPTION = """\
Size a fleet for a workload: the fewest target replicas whose p99 time per output token stays within
--budget-tpot-ms while they keep up with the arrivals, with speculation (a step speculates where
router/cost_model.py prices it above a target-only token at the replica's load, as the policy does)
and target-only; the draft device time
that needs, in draft workers; and what speculation saves. It simulates a replica's passes with your
measured costs (continuous batching, chunked prompts, each task's acceptance): replicas share the load
evenly, so it simulates a few of them whatever the fleet's size.

What it is good for, as checked against bench runs its costs were not fitted on
(bench/plan_check.py; docs/pages/deployment.md has the table): throughput within 15%% at up to
%(validated)d sessions a replica, on the load shape its costs were measured on (22 of 24 held-out
rows; mean error 8%%, worst 25%%). Not validated: more sessions a replica (16-64: 6 of 18 rows within
15%%, mean error 19%%, worst 49%%), other load shapes (a json-schema and a shared-prefix run: 2 of 10
rows, mean 29%%), and the p99 time per output token the fleet is sized by (10 of 42 held-out rows
within 15%%; AUTO's measured p99 up to 2.3 times the predicted). Where a plan goes past
%(validated)d sessions a replica, it says so.

--workload FILE (YAML or JSON): {"rate": requests/s (or "clients": N, each waiting for its last
answer), "prompt_tokens": N, "output_tokens": N (the mean a request gives), "tasks": {NAME: {"share":
S, "alpha": A, "k": K, "draft_free": true if the router's n-gram or suffix proposer serves it}}}
(alpha and k left out: that task runs target-only; "tasks" left out with --address: the service's).
--costs FILE (JSON): {"pass_ms": [[tokens in a pass, ms], ...] (a replica's pass-time curve: a
worker logs it at start-up, "a pass of 1/2/.../64 tokens takes ... ms"), "pass_overhead_ms" and
"session_overhead_ms": what a pass, and each session in it, costs the serving replica beyond the
model, "draft_pass_ms": [[sessions in a pass, ms], ...] (a draft worker's pass, one token a session)
or "draft_token_ms": a draft worker's device time per drafted token (the bench's "draft ms/token"),
"draft_devices": the draft devices one replica's sessions share (0 or left out: enough that none
waits for another), "step_hop_ms": a speculating step's round trip through the router, "lookahead":
false if router.lookahead is off, "max_sessions_per_pass", "max_tokens_per_pass" (the replica's
batching settings; defaults 32 and 512)}. The router's CPU is not modelled (it runs on machines of
its own). `python -m specserve.bench.plan_check CALIB` measures them from a bench run and writes
them into its results.json, which --costs reads as it is.
--address HOST:PORT, instead of --costs: a running service's costs (its target replicas' pass of
each width as they timed it at start-up, a drafted token's time from its policy's cost ratio c; the
rest at its defaults) and, where the workload file has no "tasks", the tasks it has served (each
task and proposer with its share of the requests and the k and alpha its counters show).""" % {
    "validated": VALIDATED_SESSIONS}


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("plan", help="size target replicas and draft workers for a workload, by simulation",
                                 description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", type=Path, required=True, metavar="FILE", help="the workload (see above)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--costs", type=Path, metavar="FILE", help="a replica's measured costs (see above)")
    source.add_argument("--address", metavar="HOST:PORT",
                        help="take the costs, and the tasks the workload leaves out, from a running service (see above)")
    parser.add_argument("--budget-tpot-ms", type=float, required=True, metavar="MS",
                        help="the p99 time per output token every request must keep within")
    parser.add_argument("--max-replicas", type=int, default=100_000, help="the largest fleet tried (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="simulated seconds per replica (default: %(default)s; more: steadier tails)")
    parser.add_argument("--sample-replicas", type=int, default=3, help="replicas simulated (default: %(default)s)")
    parser.add_argument("--out", type=Path, metavar="FILE", help="also write the plan as JSON")
    parser.set_defaults(run=run)


def read_workload(path: Path, served: tuple[TaskLoad, ...] = ()) -> Workload:
    """``served``: the tasks a running service measured, for a workload that gives none."""
    data = _read(path, "workload")
    try:
        tasks = tuple(TaskLoad(name, float(t.get("share", 0)), float(t.get("alpha", 0)), int(t.get("k", 0)),
                               bool(t.get("draft_free", False))) for name, t in data["tasks"].items()) \
            if data.get("tasks") or not served else served
        return Workload(tasks, int(data["prompt_tokens"]), int(data["output_tokens"]),
                        float(data["rate"]) if "rate" in data else None,
                        int(data["clients"]) if "clients" in data else None)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SystemExit(_refuse(f"{path}: not a workload ({exc}): it needs rate or clients, prompt_tokens, "
                                 "output_tokens and tasks (tasks may be left out with --address)"))


NOT_MODELLED = ("router_step_ms", "host_cores")  # the router's CPU on a shared host: a fit that held for one run only


def read_costs(path: Path) -> Costs:
    data = _read(path, "costs")
    if isinstance(data.get("costs"), dict):  # a plan check's results.json: the costs it measured from a bench run
        data = data["costs"]
    if any(data.get(name) for name in NOT_MODELLED):
        print(f"specserve plan: {path}: {' and '.join(NOT_MODELLED)} are ignored: the planner no longer models "
              "the router's CPU on a host shared with the devices (fitted on one run, it did not hold on others)",
              file=sys.stderr)
    try:
        return Costs(_curve(data["pass_ms"]), draft_token_ms=float(data.get("draft_token_ms", 0)),
                     max_sessions_per_pass=int(data.get("max_sessions_per_pass", 32)),
                     max_tokens_per_pass=int(data.get("max_tokens_per_pass", 512)),
                     pass_overhead_ms=float(data.get("pass_overhead_ms", 0)),
                     session_overhead_ms=float(data.get("session_overhead_ms", 0)),
                     draft_pass_ms=_curve(data.get("draft_pass_ms", ())), draft_devices=int(data.get("draft_devices", 0)),
                     step_hop_ms=float(data.get("step_hop_ms", 0)), lookahead=bool(data.get("lookahead", True)))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SystemExit(_refuse(f"{path}: not a replica's costs ({exc}): it needs pass_ms, [[tokens, ms], ...]"))


def service_costs(stats: pb.ServiceStats) -> Costs:
    """A running service's costs: its target replicas' pass of each width as they timed it at start-up
    (the slowest replica's), or else the pass-time line its router fitted on the passes it has seen;
    a draft token's time from the policy's cost ratio c of each draft worker's proposals (c times a
    one-token pass), weighted by the tokens drafted. What its stats do not hold (the overheads, the
    round trip, draft devices, batching limits) keeps its default."""
    slowest: dict[int, float] = {}
    for worker in stats.workers:
        if worker.kind == "target":
            for tokens, seconds in zip(worker.pass_widths, worker.pass_seconds):
                slowest[tokens] = max(seconds, slowest.get(tokens, 0.0))
    pass_ms = tuple((tokens, 1000 * seconds) for tokens, seconds in sorted(slowest.items()))
    line = stats.load
    if not pass_ms and line.pass_fixed_seconds > 0:
        pass_ms = tuple((t, 1000 * (line.pass_fixed_seconds + line.pass_seconds_per_token * t)) for t in (1, 16, 512))
    if not pass_ms:
        raise SystemExit(_refuse("the service's target replicas report no pass timings yet, and its router has "
                                 "fitted none: give --costs, or send it traffic first"))
    costs = Costs(pass_ms)
    drafted = [(row.drafted_tokens, row.cost_ratio) for row in stats.tasks
               if row.draft and row.draft not in DRAFT_FREE and row.drafted_tokens and row.cost_ratio > 0]
    if drafted:  # the policy's c_wall: what the router waits per drafted token, round trips included, so a
        # step's hop is counted in it as well as in step_hop_ms (0 here): an upper bound on the draft's cost
        c = sum(tokens * ratio for tokens, ratio in drafted) / sum(tokens for tokens, _ in drafted)
        costs = replace(costs, draft_token_ms=c * 1000 * costs.pass_seconds(1))
    return costs


def service_tasks(stats: pb.ServiceStats) -> tuple[TaskLoad, ...]:
    """Each (task, proposer) the service has served, as a task of the workload (``cluster/plan.py``
    ``served_arm``): its share of the requests, k its proposed tokens a verify step (one prompt pass
    a request proposes nothing), alpha the policy's estimate of it."""
    return tuple(served_arm(f"{row.task}/{row.draft or 'target-only'}", row.requests, row.draft,
                            row.proposed_tokens / max(row.target_passes - row.requests, 1), row.alpha)
                 for row in stats.tasks if row.requests)


def _curve(points) -> tuple[tuple[int, float], ...]:
    return tuple((int(w), float(ms)) for w, ms in points)


def _read(path: Path, what: str) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SystemExit(_refuse(f"cannot read the {what} file {path}: {exc}"))
    if not isinstance(data, dict):
        raise SystemExit(_refuse(f"{path}: the {what} file must hold a mapping"))
    return data


def _refuse(message: str) -> int:
    print(f"specserve plan: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if args.budget_tpot_ms <= 0 or args.max_replicas < 1 or args.seconds <= 0 or args.sample_replicas < 1:
        return _refuse("--budget-tpot-ms and --seconds must be above 0, --max-replicas and --sample-replicas at least 1")
    if args.address:
        stats = SpecServeClient(args.address).stats()
        workload, costs = read_workload(args.workload, service_tasks(stats)), service_costs(stats)
        print(f"costs from {args.address}: a pass of " + ", ".join(f"{t}: {ms:.1f}" for t, ms in costs.pass_ms)
              + f" tokens: ms; a drafted token {costs.draft_token_ms:.2f} ms")
    else:
        workload, costs = read_workload(args.workload), read_costs(args.costs)
    started = time.perf_counter()
    found = plan(workload, costs, args.budget_tpot_ms / 1000, max_replicas=args.max_replicas, seconds=args.seconds,
                 sample_replicas=args.sample_replicas)
    load = f"{workload.rate:g} requests/s" if workload.rate is not None else f"{workload.clients} clients"
    print(f"{load}, {workload.prompt_tokens} prompt + {workload.output_tokens} output tokens, p99 time per output token "
          f"<= {args.budget_tpot_ms:g} ms ({time.perf_counter() - started:.1f} s to plan)")
    print(f"{'':<14} {'target replicas':>15} {'draft workers':>13} {'tokens/s':>10} {'p50 / p99 TPOT ms':>18} "
          f"{'p99 TTFT s':>10} {'steps speculating':>17} {'sessions/replica':>16}")
    for name, fleet in (("speculation", found.speculating), ("target-only", found.target_only)):
        print(f"{name:<14} " + (_row(fleet) if fleet else f"none within {args.max_replicas} replicas"))
    if found.replicas_saved is not None and found.replicas_saved > 0:
        print(f"speculation saves {found.replicas_saved} of {found.target_only.replicas} target replicas "
              f"({found.replicas_saved / found.target_only.replicas:.0%})")
    elif found.replicas_saved is not None:
        print(f"speculation saves no target replicas at this load ({-found.replicas_saved} more): its verify passes "
              "cost more than the tokens they add here; serve these tasks target-only or with fewer draft tokens")
    for line in caveats(found.speculating, found.target_only):
        print(line)
    if args.out:
        args.out.write_text(json.dumps({"budget_tpot_ms": args.budget_tpot_ms, "validated_sessions": VALIDATED_SESSIONS,
                                        "workload": asdict(workload), "costs": asdict(costs),
                                        "speculating": found.speculating and asdict(found.speculating),
                                        "target_only": found.target_only and asdict(found.target_only)}, indent=1))
    return 0


def caveats(speculating: Fleet | None, target_only: Fleet | None) -> list[str]:
    """What the plan rests on that was not checked: always the p99 time per output token and the
    load shape; a warning for each fleet past the sessions a replica its throughput was checked at."""
    lines = [f"checked (bench/plan_check.py, on runs its costs were not fitted on: embedded CPU clusters, costs from "
             f"one bench run): throughput within 15% at up to {VALIDATED_SESSIONS} sessions a replica, on the load "
             "shape the costs were measured on; not checked: GPU costs or a running service's (--address), the p99 "
             "time per output token the fleet is sized by, other prompt and output lengths"]
    for name, fleet in (("speculation", speculating), ("target-only", target_only)):
        if fleet is not None and not fleet.validated:
            lines.append(f"warning: the {name} plan puts {fleet.sessions_per_replica:.0f} sessions on a replica, past "
                         f"the {VALIDATED_SESSIONS} its throughput was checked at (`specserve plan --help`): measure a "
                         "replica at that load before relying on it")
    return lines


def _row(fleet: Fleet) -> str:
    return (f"{fleet.replicas:>15} {fleet.draft_workers:>13.1f} {fleet.tokens_per_second:>10.0f} "
            f"{fleet.p50_tpot * 1000:>8.1f} / {fleet.p99_tpot * 1000:<7.1f} {fleet.p99_ttft:>10.2f} "
            f"{fleet.speculated:>17.0%} {fleet.sessions_per_replica:>16.1f}")
