"""`specserve demo` / `make demo`: speculative decoding on held-out prompts of every task, side by side.

By default through the service: an embedded cluster is started, prompts go over gRPC, and the
cluster is stopped at the end; `--in-process` runs the same table on the in-process engine.
For each task the same prompts are decoded greedily by the target alone and with the task's draft,
alternating prompt by prompt so that both see the same machine load; the speedup is the ratio of the
two measured times, and the output of the two paths is compared token for token. Through the service
a third run sends each prompt with nothing but the prompt, as the routing policy serves it.
With ``variants`` each task also gets a row for Medusa heads and an MTP module of the zoo's target
(distilled beside the zoo on first use, minutes each: cluster/zoo/host_path.py's ``zoo_heads``),
for a draft of another tokenizer (cluster/zoo/other_tokenizer.py) and for the task's draft under
prompt lookup (a cascade, workers/drafting.py).
"""

from __future__ import annotations

import copy
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specserve.proto.v1 import specserve_pb2 as pb
from specserve.router.cost_model import expected_speedup
from specserve.workers.engine import SpecEngine
from specserve.workers.heads.checkpoint import read_facts
from specserve.workers.heads.mtp import MTP
from specserve.workers.loading import ModelSpec
from specserve.workers.proposer_kinds import CASCADE
from specserve.workers.request import GenerationParams
from specserve.workers.stats import SpecStats
from specserve.cluster.zoo.build import build_zoo
from specserve.cluster.zoo.head import HEAD
from specserve.cluster.zoo.host_path import MEDUSA, zoo_variants
from specserve.cluster.zoo.other_tokenizer import OTHER_TOKENIZER, read_other_facts
from specserve.cluster.zoo.presets import PRESETS, get_preset
from specserve.cluster.zoo.zoo import MANIFEST, Zoo

from .bringup import start_service
from .client import SpecServeClient, stats_from_message
from .local import zoo_engine, zoo_location


@dataclass
class TaskResult:
    task: str
    draft: str
    alpha_held_out: float  # from the zoo manifest (teacher-forced, held-out slice)
    k: int
    stats: SpecStats = field(default_factory=SpecStats)  # the speculative runs, summed
    target_only: SpecStats = field(default_factory=SpecStats)  # the target-only runs, summed
    seconds_target_only: float = 0.0
    seconds_speculative: float = 0.0
    identical: bool = True
    # Through the service only: the same prompts with no task, draft or k (the routing policy decides).
    seconds_routed: float = 0.0
    routed_to: Counter = field(default_factory=Counter)  # draft that served each ("" = target-only)

    @property
    def routed_speedup(self) -> float:
        return self.seconds_target_only / self.seconds_routed if self.seconds_routed else 0.0

    @property
    def speedup(self) -> float:
        return self.seconds_target_only / self.seconds_speculative if self.seconds_speculative else 0.0

    @property
    def cost_ratio(self) -> float:
        """c: the draft's time per token it drafted over a target-only step's, as measured in these runs."""
        return self.stats.cost_ratio(self.target_only)

    @property
    def bound(self) -> float:
        """The speedup the cost model predicts from this run's alpha, c and k."""
        return expected_speedup(self.stats.alpha, self.cost_ratio, self.k)


# Every prompt is decoded on several paths, one after the other: suffix decoding's memory of the
# task's recent outputs would hold the answer to the prompt being measured by its second path, and
# credit speculation with a repeat an unseen prompt never has. Measurements run without it (each
# request proposes from its own text); `specserve bench` uses the same.
MEASURED_ON_UNSEEN = {"router": {"suffix": {"global_tokens": 0}}}
# Decodes one prompt greedily, with the named draft or (None) the target alone: ids, seconds, stats.
Decoder = Callable[[str, str, "str | None"], tuple[list[int], float, SpecStats]]
# Decodes one prompt greedily as the service routes it: ids, seconds, the draft that served ("": none).
RoutedDecoder = Callable[[str], tuple[list[int], float, str]]


def run_demo(zoo_name: str, prompts_per_task: int, max_tokens: int, k: int, in_process: bool = False,
             address: str | None = None, variants: bool = False) -> list[TaskResult]:
    """Through the service (an embedded cluster started here, or the one at ``address``, which must
    serve the variants if asked for), or in this process."""
    zoo = ensure_zoo(zoo_name)
    # name -> directory: Medusa heads, a target carrying an MTP module, a draft of another tokenizer
    heads = zoo_variants(zoo) if variants else {}
    if in_process:
        engine = zoo_engine(zoo, zoo.draft_names, extra={name: ModelSpec(str(where)) for name, where in heads.items()})
        print(f"{_zoo_line(zoo)}; both models in this process, {torch.get_num_threads()} torch threads; "
              f"greedy, k={k}, {max_tokens} tokens per prompt", flush=True)
        cascades = {task: zoo.default_draft(task) for task in zoo.tasks}
        return _measure_all(zoo, engine_decoder(engine, max_tokens, k, cascades), prompts_per_task, k, None, heads,
                            variants)
    service = None
    if address is None:
        print("starting the embedded cluster (Ray, Serve, target replica, draft pool)...", flush=True)
        models = {"zoo": str(zoo.root), "drafts": {name: str(where) for name, where in heads.items()}}
        service = start_service(port=0, overrides={"models": models, **copy.deepcopy(MEASURED_ON_UNSEEN)})
        address = service.address
    client = SpecServeClient(address)
    try:
        print(f"{_zoo_line(zoo)}; through the service at {address} over gRPC (target replica and draft workers "
              f"in their own processes); greedy, k={k}, {max_tokens} tokens per prompt", flush=True)
        return _measure_all(zoo, service_decoder(client, max_tokens, k), prompts_per_task, k,
                            routed_decoder(client, max_tokens), heads, variants)
    finally:
        client.close()
        if service:
            service.stop()


def ensure_zoo(zoo_name: str) -> Zoo:
    """A preset's zoo, built on first use; one built before a stage was added (its EAGLE-3 head)
    gets that stage now (``build_zoo`` returns at once for a complete zoo)."""
    location = zoo_location(zoo_name)
    if zoo_name not in PRESETS:
        return Zoo.open(location)
    if not (location / MANIFEST).exists():
        print(f"building the {zoo_name} zoo in {location} (once; later runs reuse it)", flush=True)
    elif HEAD not in Zoo.open(location).draft_names:
        print(f"adding an EAGLE-3 head to the {zoo_name} zoo in {location} (once, minutes)", flush=True)
    else:
        zoo = Zoo.open(location)
        if get_preset(zoo_name).specialize_general and not specialized(zoo):
            print(f"note: the {zoo_name} zoo in {location} was built before task drafts started from the general "
                  f"one; they were trained from scratch (delete it to rebuild with drafts that beat the general "
                  f"draft on their tasks)", flush=True)
        return zoo
    logging.getLogger("specserve").setLevel(logging.INFO)  # a build is long: say what each stage did
    return build_zoo(get_preset(zoo_name), location)


def specialized(zoo: Zoo) -> bool:
    """Whether the zoo's task drafts started from its general draft (the manifest says so)."""
    return any(entry.get("started_from") for entry in zoo.manifest["drafts"].values())


def _zoo_line(zoo: Zoo) -> str:
    return (f"zoo {zoo.manifest['preset']}: target {zoo.manifest['target']['parameters'] / 1e6:.1f}M parameters, "
            f"drafts {', '.join(zoo.draft_names)}")


def _measure_all(zoo: Zoo, decode: Decoder, prompts: int, k: int, routed: RoutedDecoder | None,
                 heads: dict[str, Path], cascade: bool = False) -> list[TaskResult]:
    _warm_up(decode, zoo)
    results = [result for task in zoo.tasks
               for result in measure_task(decode, zoo, task, prompts, k, routed, heads, cascade)]
    print(format_table(results))
    return results


def measure_task(decode: Decoder, zoo: Zoo, task: str, prompts: int, k: int,
                 routed: RoutedDecoder | None = None, heads: dict[str, Path] | None = None,
                 cascade: bool = False) -> list[TaskResult]:
    """The task's own draft, the zoo's EAGLE-3 head (if it has one), ``heads`` (variants distilled
    beside the zoo) and with ``cascade`` the task's draft under prompt lookup, each against the same
    target-only runs; the routed runs go with the first row."""
    drafts = [zoo.default_draft(task)] + [HEAD] * (HEAD in zoo.draft_names and HEAD != zoo.default_draft(task))
    results = [TaskResult(task, draft, zoo.manifest["acceptance"][task][draft], k) for draft in drafts]
    # A variant's held-out acceptance is distill's, over every task's text.
    results += [TaskResult(task, name, (read_facts(where) or read_other_facts(where)).get("held_out_alpha", float("nan")), k)
                for name, where in (heads or {}).items()]
    if cascade:  # measured as it is served: no held-out figure
        results.append(TaskResult(task, CASCADE, float("nan"), k))
    for prompt in zoo.prompts(task)[:prompts]:
        off_ids, off_seconds, off_stats = decode(prompt, task, None)
        for result in results:
            on_ids, on_seconds, stats = decode(prompt, task, result.draft)
            result.seconds_target_only += off_seconds
            result.seconds_speculative += on_seconds
            result.identical &= on_ids == off_ids
            result.stats.add(stats)
            result.target_only.add(off_stats)
        if routed is not None:
            routed_ids, routed_seconds, served_by = routed(prompt)
            results[0].seconds_routed += routed_seconds
            results[0].routed_to[served_by] += 1
            results[0].identical &= routed_ids == off_ids
    return results


VARIANTS = (MEDUSA, MTP, OTHER_TOKENIZER, CASCADE)  # zoo_variants' names, and the cascade


def format_table(results: list[TaskResult]) -> str:
    routed = any(r.seconds_routed for r in results)
    header = (f"{'task':<6} {'draft':<8} {'alpha':>6} {'alpha(zoo)':>10} {'acc.rate':>8} {'tok/pass':>8} "
              f"{'c':>6} {'wasted':>6} {'speedup':>8} {'bound':>6} {'identical':>9}")
    if routed:
        header += f" {'routed':>7}  routed to"
    lines = [header, "-" * len(header)]
    for r in results:
        line = (f"{r.task:<6} {r.draft:<8} {r.stats.alpha:>6.2f} {r.alpha_held_out:>10.2f} "
                f"{r.stats.acceptance_rate:>8.2f} {r.stats.tokens_per_pass:>8.2f} {r.cost_ratio:>6.3f} "
                f"{r.stats.wasted_share:>6.2f} "
                f"{r.speedup:>7.2f}x {r.bound:>5.2f}x {'yes' if r.identical else 'NO':>9}")
        if routed and r.seconds_routed:
            served = ", ".join(f"{d or 'target-only'} {n}" for d, n in r.routed_to.most_common())
            line += f" {r.routed_speedup:>6.2f}x  {served}"
        lines.append(line)
    lines += [
        "alpha: per-token acceptance in this run (accepted / (accepted + rejections)); alpha(zoo): the same on the",
        "zoo's held-out slice, teacher-forced; acc.rate: accepted / proposed draft tokens; tok/pass: tokens",
        "committed per target forward pass; c: the draft's time per token it drafted / a target-only step's",
        "time, measured here; wasted: the share of drafted tokens no proposal used (drafted ahead, the guess",
        "missed); speedup: target-only time / speculative time, run alternately here; bound:",
        "(1 - alpha^(k+1)) / ((1 - alpha)(kc + 1)), Leviathan et al.'s expected speedup from this run's alpha, c",
        "and k when drafting and verifying take turns.",
        "Through the service, greedy drafts run ahead while the target verifies, so the speedup can exceed it.",
        f"{HEAD}: the zoo's EAGLE-3 head, drafting from the target's hidden states (no lookahead; its first step",
        "proposes nothing), on the same prompts against the same target-only runs as the row above it.",
    ]
    if {r.draft for r in results} & set(VARIANTS):
        lines += [
            "medusa: Medusa heads on the target replica, guessing in its verify pass; mtp: the target carrying an MTP",
            "module, drafting on the draft workers from its last hidden states; both distilled beside the zoo (their",
            "alpha(zoo), where measured, distill's over every task's held-out text).",
        ]
    if CASCADE in {r.draft for r in results}:
        lines += [
            f"{CASCADE}: the task's draft under prompt lookup: the draft worker takes lookup's guesses in the draft's",
            "first pass and proposes them whole, past k, then its own tokens (docs: design, cascades).",
        ]
    if OTHER_TOKENIZER in {r.draft for r in results}:
        lines += [
            f"{OTHER_TOKENIZER}: a draft of another tokenizer (its own BPE, trained on the target's text), drafting among",
            "the tokens it shares with the target (exact q) and reading the text re-encoded; its alpha(zoo): greedy,",
            "through the bridge, on held-out prompts of every task.",
        ]
    if routed:
        lines += [
            "routed: the same prompts sent with no task, draft or k: the service classifies the prompt, picks the draft",
            "and k by expected speedup (or serves the task target-only where no draft pays), and adapts k per step;",
            "its policy learns from this run's traffic, so its first requests per task explore.",
        ]
    return "\n".join(lines)


def engine_decoder(engine: SpecEngine, max_tokens: int, k: int, cascades: dict[str, str] | None = None) -> Decoder:
    """``cascades``: task -> the draft model its cascade runs (for the draft ``cascade``)."""
    def decode(prompt: str, task: str, draft: str | None) -> tuple[list[int], float, SpecStats]:
        params = GenerationParams(max_tokens=max_tokens, k=k, speculation=draft is not None)
        start = time.perf_counter()
        members = ((cascades or {})[task],) if draft == CASCADE else ()
        done = engine.generate(prompt, params, draft=draft, members=members).complete()
        return done.token_ids, time.perf_counter() - start, done.stats
    return decode


def service_decoder(client: SpecServeClient, max_tokens: int, k: int) -> Decoder:
    def decode(prompt: str, task: str, draft: str | None) -> tuple[list[int], float, SpecStats]:
        request = pb.GenerateRequest(prompt=prompt, task=task, max_tokens=max_tokens, k=k, draft=draft or "",
                                     speculation=pb.SPECULATION_ON if draft else pb.SPECULATION_OFF)
        start = time.perf_counter()
        response = client.generate(request)
        return list(response.token_ids), time.perf_counter() - start, stats_from_message(response.stats)
    return decode


def routed_decoder(client: SpecServeClient, max_tokens: int) -> RoutedDecoder:
    def decode(prompt: str) -> tuple[list[int], float, str]:
        start = time.perf_counter()
        response = client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=max_tokens))
        return list(response.token_ids), time.perf_counter() - start, response.stats.draft
    return decode


def _warm_up(decode: Decoder, zoo: Zoo) -> None:
    """First calls pay one-off costs (allocator, kernels, connections); keep them out of the measurements."""
    task = zoo.tasks[0]
    for draft in (None, zoo.default_draft(task)):
        decode(zoo.prompts(task)[0], task, draft)
