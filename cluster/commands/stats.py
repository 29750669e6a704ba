"""`specserve stats`: a running service's statistics (its GetStats), as tables or JSON."""

from __future__ import annotations

import argparse
import json

from .common import SECURITY_EPILOG


def register(commands: argparse._SubParsersAction) -> None:
    stats = commands.add_parser("stats", help="print a running service's statistics (GetStats)", epilog=SECURITY_EPILOG)
    stats.add_argument("--address", required=True, metavar="HOST:PORT", help="the service's client address")
    stats.add_argument("--json", action="store_true", help="print JSON instead of tables")
    stats.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from specserve.workers.stats import wasted_share

    from ..client import SpecServeClient

    stats = SpecServeClient(args.address).stats()
    if args.json:
        print(json.dumps(MessageToDict(stats, preserving_proto_field_name=True)))
        return 0
    print(f"{stats.router or 'router'}: requests in flight {stats.requests_in_flight}; queued {stats.requests_queued}; "
          f"rejected (over the limit) {stats.requests_rejected}")
    if stats.ready:
        print("ready: speculation on (a target replica, the whole draft pool and a worker for every draft registered)")
    else:
        print(f"starting: a request whose draft no worker serves yet runs target-only (route 'starting'); "
              f"waiting for {stats.waiting_for}")
    print("Per task, its decision (draft '-': the task, and its target-only requests), then each allowed draft;")
    print("k at the current load (k1: with one session per pass), and what a step of k costs in target steps:")
    print("drafted: tokens the draft computed (proposed or not); wasted: of those, drafted ahead for a verdict that")
    print("did not come; c_wall: what the router waits per drafted token over a target-only step (wall time):")
    print(f"{'task':<8} {'draft':<8} {'requests':>8} {'drafted':>8} {'wasted':>6} {'proposed':>9} {'accepted':>9} "
          f"{'tok/pass':>8} {'alpha':>6} {'c_wall':>6} {'k':>2} {'k1':>2} {'cost':>5} {'speedup':>7} {'scored':>7} decision")
    for t in stats.tasks:
        decision = f"{t.decision}: {t.reason}" if t.reason else t.decision
        wasted = f"{wasted_share(t.wasted_draft_tokens, t.drafted_tokens):.0%}"
        print(f"{t.task:<8} {t.draft or '-':<8} {t.requests:>8} {t.drafted_tokens:>8} {wasted:>6} "
              f"{t.proposed_tokens:>9} {t.accepted_tokens:>9} {t.tokens_per_pass:>8.2f} {t.alpha:>6.2f} "
              f"{t.cost_ratio:>6.2f} {t.k:>2} {t.unloaded_k:>2} {t.step_cost:>5.2f} {t.expected_speedup:>7.2f} {t.scored_tokens:>7} {decision}")
    sampled = [f"{t.task} {t.sampled_requests}" for t in stats.tasks if not t.draft and t.sampled_requests]
    if sampled:
        print(f"traffic sample (router.traffic_sample; `specserve distill --sample`): {', '.join(sampled)} requests kept")
    _print_segments(stats)
    _print_canaries(stats)
    _print_batches(stats)
    print("Workers; prefix hits: of the prompt tokens of its sessions, those its prefix cache held:")
    print(f"{'worker':<22} {'kind':<6} {'address':<22} {'node':<12} {'sessions':>8} {'prefix hits':>11} models")
    for w in stats.workers:
        hits = f"{w.prefix_reused_tokens / w.prefix_prompt_tokens:.0%}" if w.prefix_prompt_tokens else "-"
        print(f"{w.worker_id:<22} {w.kind:<6} {w.address:<22} {w.node_id[:12]:<12} {w.live_sessions:>8} {hits:>11} "
              f"{', '.join(w.models)}")
    return 0


def _print_segments(stats) -> None:
    """Per (task, draft, segment) of the requests that named a segment (router.segments)."""
    if not stats.segments:
        return
    print("Per segment (a request's segment as counted: a name router.segments lists, or 'other'); speedup: the")
    print("cost model's at the segment's alpha, with the draft's c and load as now, at the k best for it:")
    print(f"{'task':<8} {'draft':<8} {'segment':<16} {'requests':>8} {'proposed':>9} {'accepted':>9} {'tok/pass':>8} "
          f"{'alpha':>6} {'k':>2} {'speedup':>7}")
    for s in stats.segments:
        print(f"{s.task:<8} {s.draft or '-':<8} {s.segment:<16} {s.requests:>8} {s.proposed_tokens:>9} "
              f"{s.accepted_tokens:>9} {s.tokens_per_pass:>8.2f} {s.alpha:>6.2f} {s.k:>2} {s.expected_speedup:>7.2f}")


def _print_canaries(stats) -> None:
    """Each canary (`specserve canary`): its state, and its arms' alpha and what it is worth."""
    if not stats.canaries:
        return
    print("Canaries (a new version on a share of its draft's traffic; promoted when its alpha beats the draft's by")
    print("z >= needed, rolled back at z <= -needed or at the last look; speedup: what each alpha is worth as now):")
    print(f"{'version':<20} {'share':>5} {'state':<12} {'looks':>5} {'requests':>9} {'alpha':>11} {'speedup':>11} "
          f"{'z':>6} {'needed':>6}  why")
    for c in stats.canaries:
        print(f"{c.version:<20} {c.share:>5.0%} {c.state:<12} {f'{c.looks}/{c.max_looks}':>5} "
              f"{f'{c.canary_requests}/{c.base_requests}':>9} {f'{c.canary_alpha:.2f}/{c.base_alpha:.2f}':>11} "
              f"{f'{c.canary_speedup:.2f}/{c.base_speedup:.2f}':>11} {c.z:>6.2f} {c.z_needed:>6.2f}  {c.reason}")


def _print_batches(stats) -> None:
    """The passes the latest steps ran in, and what the policy prices a step at under that load."""
    print("Batches (latest steps; a pass of n sessions counts once per session):")
    print(f"{'kind':<6} {'steps':>6} {'sessions/pass mean':>18} {'p50':>5} {'tokens/pass mean':>16} {'p50':>5} "
          f"{'queue ms mean':>13} {'p50':>6}")
    for p in stats.passes:
        print(f"{p.kind:<6} {p.steps:>6} {p.mean_sessions:>18.1f} {p.p50_sessions:>5.0f} {p.mean_tokens:>16.1f} "
              f"{p.p50_tokens:>5.0f} {p.mean_queue_seconds * 1e3:>13.2f} {p.p50_queue_seconds * 1e3:>6.2f}")
    load = stats.load
    fit = (f"a target pass takes {load.pass_fixed_seconds * 1e3:.2f} ms + {load.pass_seconds_per_token * 1e3:.3f} ms "
           f"per token" if load.pass_fixed_seconds or load.pass_seconds_per_token else "no pass-time fit yet")
    print(f"policy load: {load.sessions:.1f} sessions per pass{', target saturated' if load.saturated else ''}; {fit}")
