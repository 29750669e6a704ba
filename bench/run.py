"""`specserve bench`: one run, every section against the same service and the same in-process models.

Sections, in order (each prints what it does; a progress bar counts decodes):
  warm-up   one decode per path, then routed requests so the policy starts from traffic
  greedy    per held-out prompt, every path of samples.GREEDY_PATHS back to back, outputs compared
  score     every draft scored against the target's greedy output of every prompt (alpha matrix)
  sampling  per temperature, the task's draft against target-only with the same seed
  load      1-32 concurrent clients, mixed tasks, speculation OFF then AUTO (order alternates), the
            workers' batch sizes per level, their memory around the most-clients level
  memory    resident memory of the target replica, draft workers and router
With the service stopped, the rest of the load section: the same service with batching off (a
second bring-up, some levels, OFF), then the peers (transformers' static batch and generate_batch,
in a process pinned like the target replica), and every load output against the target's.
Then results.json (settings, raw samples, figures), report.md and the plots.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import ray
import torch
import transformers
from tqdm import tqdm
from transformers.utils import logging as hf_logging

from specserve.cluster.bringup import default_config_path, merge_into, serve_config, start_service
from specserve.cluster.client import READY_TIMEOUT_SECONDS, SpecServeClient
from specserve.cluster.commands.serve import sim_overrides
from specserve.cluster.config import ServiceConfig
from specserve.cluster.demo import MEASURED_ON_UNSEEN, ensure_zoo
from specserve.cluster.local import zoo_engine
from specserve.workers.config import TargetConfig
from specserve.workers.drafting import score_continuation
from specserve.workers.heads.proposer import score_head
from specserve.workers.engine import SpecEngine
from specserve.workers.prompt import encode_prompt
from specserve.workers.grpc_host import Device
from specserve.workers.sim_device import SimConfig
from specserve.cluster.zoo.zoo import Zoo

from . import load as load_section
from .device import facts as device_facts
from .device import placement
from .device import resolve as resolve_device
from .decoders import decode_engine, decode_hf_assisted, decode_service, service_request
from .figures import derive
from .memory import resident_memory
from .peers import PEERS, measure_peers_pinned
from .plan_check import check as check_planner
from .plots import write_plots
from .prompts import load_prompts
from .report import render_report, summary
from .samples import ENGINE_OFF, ENGINE_TASK, GREEDY_PATHS, HF_ASSISTED, OFF, OFF_UNBATCHED, ROUTED, TASK, Sample
from .settings import REPLICA_CORE, BenchSettings, Goals, provenance

# The service with batching off: one session per forward pass, on the target and on the drafts.
UNBATCHED = {part: {"batching": {"max_sessions_per_pass": 1}} for part in ("target", "draft_pool")}
# The second cluster of the process starts right after the first one stopped; a bring-up that fails
# then (CI saw one, its cause unrecorded) is tried once more, and its error is kept in the report.
UNBATCHED_BRING_UPS = 2


class Bench:
    def __init__(self, settings: BenchSettings, zoo: Zoo, prompts: dict[str, list[str]], client: SpecServeClient,
                 engine: SpecEngine, device: Device, own_cluster: bool) -> None:
        self.s, self.zoo, self.prompts, self.client, self.engine, self.device = settings, zoo, prompts, client, engine, device
        self.own_cluster = own_cluster  # the service's processes are this process's children
        self.samples: list[Sample] = []
        # What the load section measures beside its samples: the workers' passes per level and mode,
        # their memory around the most-clients level, and what could not run.
        self.load_info: dict = {"passes": [], "rss": None, "peer_errors": {}, "unbatched": None}
        self.bar = tqdm(total=self._decodes(), unit="decode", desc="bench", file=sys.stderr, dynamic_ncols=True)

    def _decodes(self) -> int:
        tasks, sections = len(self.zoo.tasks), self.s.sections
        paths = len(GREEDY_PATHS) - (0 if self.s.peer else 1)
        load = sum(map(self.s.level_requests, self.s.concurrency))
        unbatched = 0 if self.s.address else sum(map(self.s.level_requests, self.s.unbatched()))
        return (tasks * (self.s.warm_up + paths)
                + ("greedy" in sections) * tasks * self.s.prompts * self.s.repeats * paths
                + ("sampling" in sections) * tasks * len(self.s.temperatures) * self.s.sampled_prompts * 2
                + ("load" in sections) * (load * (2 + len(PEERS) * self.s.load_peers) + unbatched))

    def measured(self, task: str) -> list[str]:
        return self.prompts[task][: self.s.prompts]

    def warm_up(self) -> None:
        """First calls pay one-off costs (allocator, connections); then the policy sees routed traffic."""
        self.section("warm-up", "one decode per path per task; routed requests so the policy learns from traffic")
        for task in self.zoo.tasks:
            spare = self.prompts[task][self.s.prompts:]  # never measured
            self.greedy_prompt(task, -1, spare[-1], repeat=-1, keep=False)
            for prompt in itertools.islice(itertools.cycle(spare), self.s.warm_up):
                decode_service(self.client, service_request(ROUTED, prompt, task, "", self.s.k, self.s.max_tokens),
                               Sample("warm-up", task, ROUTED, -1))
                self.bar.update()

    def greedy(self) -> None:
        self.section("greedy", f"{len(GREEDY_PATHS) - (not self.s.peer)} paths per prompt, back to back; "
                               "outputs compared with the target's")
        for repeat in range(self.s.repeats):
            for task in self.zoo.tasks:
                for i, prompt in enumerate(self.measured(task)):
                    self.greedy_prompt(task, i, prompt, repeat)

    def greedy_prompt(self, task: str, index: int, prompt: str, repeat: int, keep: bool = True) -> None:
        paths = [p for p in GREEDY_PATHS if self.s.peer or p != HF_ASSISTED]
        shift = (index + repeat) % len(paths)
        draft = self.zoo.default_draft(task)
        done: dict[str, Sample] = {}
        for path in paths[shift:] + paths[:shift]:  # rotate who goes first, so no path always runs cold
            sample = Sample("greedy", task, path, index, repeat)
            if path == ENGINE_OFF or path == ENGINE_TASK:
                decode_engine(self.engine, self.device, prompt, draft if path == ENGINE_TASK else None, self.s.k,
                              self.s.max_tokens, sample)
            elif path == HF_ASSISTED:
                decode_hf_assisted(self.engine, self.device, prompt, draft, self.s.max_tokens, sample)
            else:
                decode_service(self.client, service_request(path, prompt, task, draft, self.s.k, self.s.max_tokens), sample)
            done[path] = sample
            self.bar.update()
        for sample in done.values():
            sample.identical = sample.token_ids == done[OFF].token_ids
        if keep:
            self.samples.extend(done.values())

    def score(self) -> None:
        """Teacher-forced: at each position of the target's greedy output, would the draft's greedy
        choice have been that token? One forward pass per draft and prompt, in this process."""
        self.section("score", f"every draft ({', '.join(self.zoo.draft_names)}) on the target's output of every prompt")
        for off in [s for s in self.samples if s.section == "greedy" and s.path == OFF and s.repeat == 0 and s.token_ids]:
            prompt_ids = encode_prompt(self.engine.tokenizer, self.prompts[off.task][off.prompt])
            for draft in self.zoo.draft_names:
                ids = prompt_ids + off.token_ids
                if draft in self.engine.heads:  # drafts from the target's hidden states: one target pass more
                    job = (score_head, self.engine.target, self.engine.heads[draft], ids, len(prompt_ids))
                else:
                    job = (score_continuation, self.engine.drafts[draft], ids, len(prompt_ids))
                positions, matches = self.device.executor.submit(*job).result()
                self.samples.append(Sample("score", off.task, "score", off.prompt, tokens=positions, accepted=matches,
                                           draft=draft))

    def sampling(self) -> None:
        self.section("sampling", f"temperatures {', '.join(map(str, self.s.temperatures))}: the task's draft "
                                 "against target-only, same seed")
        for temperature in self.s.temperatures:
            for task in self.zoo.tasks:
                draft = self.zoo.default_draft(task)
                for i, prompt in enumerate(self.prompts[task][: self.s.sampled_prompts]):
                    for path in (TASK, OFF) if i % 2 else (OFF, TASK):
                        request = service_request(path, prompt, task, draft, self.s.k, self.s.max_tokens,
                                                  temperature, self.s.seed + i)
                        self.samples.append(decode_service(self.client, request, Sample(
                            "sampling", task, path, i, temperature=temperature)))
                        self.bar.update()

    def load(self) -> None:
        levels = self.s.concurrency
        self.section("load", f"{', '.join(map(str, levels))} concurrent clients, mixed tasks, "
                             f"{', '.join(str(self.s.level_requests(c)) for c in levels)} requests per level and mode")
        self.load_levels(self.client, load_section.MODES, levels, rss_level=max(levels))

    def load_requests(self, clients: int) -> list[tuple[str, int, str]]:
        return load_section.mixed_requests({t: self.measured(t) for t in self.zoo.tasks},
                                           self.s.level_requests(clients), self.s.load_requests)

    def load_levels(self, client: SpecServeClient, paths: tuple[str, ...], levels: tuple[int, ...],
                    rss_level: int | None = None) -> None:
        """Each level on each path (the first path alternates), with the workers' pass counters
        around every run, and every component's memory around the run of ``rss_level`` clients."""
        for n, clients in enumerate(levels):
            requests = self.load_requests(clients)
            rss_before = resident_memory(self.own_cluster) if clients == rss_level else None
            level_before = load_section.worker_counters(client)
            counters = level_before
            for path in paths[::-1] if n % 2 else paths:
                self.samples += load_section.run_level(client, requests, clients, path, self.s.max_tokens,
                                                       self.bar.update)
                after = load_section.worker_counters(client)
                self.load_info["passes"].append(load_section.pass_record(path, clients, counters, after))
                counters = after
            if rss_before is not None:
                self.load_info["rss"] = {"clients": clients, "before": rss_before,
                                         "after": resident_memory(self.own_cluster),
                                         "kv_pool_growth": load_section.pool_growth(level_before, counters)}

    def load_unbatched(self, overrides: dict) -> None:
        """The same levels on the same service with batching off: a second bring-up (this one's
        service is stopped), speculation OFF, after one untimed request per task."""
        levels = self.s.unbatched()
        if not levels or self.s.address:
            self.load_info["unbatched"] = ("not run: a running service (--address) is measured as configured"
                                           if levels else "not run: no level of unbatched_levels among the levels")
            return
        self.section("load, batching off", f"the service again with max_sessions_per_pass 1; "
                                           f"{', '.join(map(str, levels))} clients, OFF")
        failures = []
        for _ in range(UNBATCHED_BRING_UPS):
            try:
                service = start_service(port=0, overrides=unbatched_overrides(overrides))
                break
            except Exception as exc:  # noqa: BLE001  (reported; what the run measured before is kept)
                failures.append(f"{type(exc).__name__}: {exc}")
                self.bar.write(f"  the service with batching off did not start: {failures[-1]}")
        else:
            self.load_info["unbatched"] = f"not run: the service with batching off did not start: {failures}"
            return
        client = SpecServeClient(service.address)
        try:
            for task in self.zoo.tasks:
                decode_service(client, service_request(OFF, self.prompts[task][-1], task, "", self.s.k,
                                                       self.s.max_tokens), Sample("warm-up", task, OFF, -1))
            self.load_levels(client, (OFF_UNBATCHED,), levels)
            self.load_info["unbatched"] = (f"{', '.join(map(str, levels))} client(s), speculation OFF"
                                           + (f" (bring-up tried again after: {failures})" if failures else ""))
        finally:
            client.close()
            service.stop()

    def load_peers(self, target: TargetConfig) -> None:
        """The peers at every level, on the prompts the service's levels ran, in a process pinned
        like the target replica. A peer that fails is reported with its error, not measured."""
        if not self.s.load_peers:
            return
        self.section("load, peers", f"transformers {', '.join(PEERS)} at batch {', '.join(map(str, self.s.concurrency))}, "
                                    f"pinned to cores {list(target.cpus) or 'any'}, {target.threads} thread(s)")
        requests = {c: self.load_requests(c) for c in self.s.concurrency}
        prompt_ids = {c: [encode_prompt(self.engine.tokenizer, p) for _, _, p in r] for c, r in requests.items()}
        try:
            results = measure_peers_pinned(str(self.zoo.target_dir), prompt_ids, self.s.max_tokens, target.threads,
                                           target.cpus)
        except Exception as exc:  # noqa: BLE001  (its process died: reported; what the run measured before is kept)
            results = {path: f"the peers' process failed: {type(exc).__name__}: {exc}" for path in PEERS}
        for path, by_level in results.items():
            if isinstance(by_level, str):
                self.load_info["peer_errors"][path] = by_level
                self.bar.write(f"  {path} did not run: {by_level}")
            for clients, decodes in ({} if isinstance(by_level, str) else by_level).items():
                for d in decodes:
                    task, index, _ = requests[clients][d.index]
                    self.samples.append(Sample("load", task, path, index, tokens=len(d.token_ids), seconds=d.seconds,
                                               concurrency=clients, started=d.started, token_ids=d.token_ids))
            self.bar.update(sum(map(len, requests.values())))

    def compare_load_outputs(self) -> None:
        """Every load decode, every path, against the target-only output of its prompt."""
        load = [s for s in self.samples if s.section == "load"]
        reference = load_section.reference_outputs(load)
        for sample in load:
            expected = reference.get((sample.task, sample.prompt))
            sample.identical = None if expected is None else sample.token_ids == expected

    def section(self, name: str, what: str) -> None:
        self.bar.write(f"[{datetime.now():%H:%M:%S}] {name}: {what}")


def run_bench(settings: BenchSettings) -> Path:
    """Run every section and write the results; returns the run's directory."""
    hf_logging.set_verbosity_error()  # assisted generation warns about its own internal arguments on every call
    zoo = ensure_zoo(settings.zoo)
    held_out = load_prompts(zoo)
    for task, prompts in held_out.by_task.items():  # warm-up uses the prompts after the measured ones
        if len(prompts) <= settings.prompts or len(prompts) < settings.sampled_prompts:
            raise ValueError(f"{task} has {len(prompts)} benchmark prompts: --prompts {settings.prompts} must leave "
                             f"at least one for the warm-up, and --sampled-prompts {settings.sampled_prompts} fit")
    started = datetime.now(timezone.utc)
    out = settings.out / started.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=False)
    print(f"specserve bench: zoo {zoo.manifest['preset']} ({zoo.root}); results in {out}", flush=True)

    on = resolve_device(settings.device)
    device = Device(threads=1, cpus=(REPLICA_CORE,))  # one thread, like the target replica
    engine = device.executor.submit(zoo_engine, zoo, zoo.draft_names, 1, on).result()
    overrides = {"models": {"zoo": str(zoo.root)}, **copy.deepcopy(MEASURED_ON_UNSEEN)}
    merge_into(overrides, placement(on, service_config(overrides).draft_pool.workers))
    if settings.sim is not None:  # the engine and the service's model processes on one preset's timing
        engine.simulate(SimConfig(preset=settings.sim))
        merge_into(overrides, sim_overrides(settings.sim))
    merge_into(overrides, settings.service_overrides)  # the user's --set last: it wins
    service = None
    if settings.address is None:
        print("starting the embedded cluster (Ray, Serve, target replica, draft pool)...", flush=True)
        service = start_service(port=0, overrides=overrides)
    client = SpecServeClient(settings.address or service.address)
    if service is None:  # another's service: a starting one would measure target-only
        client.wait_ready(READY_TIMEOUT_SECONDS, say=print)
    bench = Bench(settings, zoo, held_out.by_task, client, engine, device, own_cluster=service is not None)
    target = target_config(overrides)
    with contextlib.closing(bench.bar):
        try:
            policy, memory = measure_on_service(bench)
        finally:
            client.close()
            if service:
                service.stop()
        if "load" in settings.sections:  # the machine is quiet now: the service is stopped
            bench.load_unbatched(overrides)
            bench.load_peers(target)
            bench.compare_load_outputs()
    meta = _meta(settings, zoo, held_out, started, target, device_facts(on, str(engine.target.dtype).removeprefix("torch.")))
    pool = service_config(overrides).draft_pool
    meta["compiled"] = {"target": target.batching.compiled,  # decode passes under torch.compile (workers/graphs.py)
                        "drafts": pool.batching.compiled}
    meta["draft_workers"] = pool.workers
    results = {"meta": meta, "samples": [s.record() for s in bench.samples], "memory": memory, "policy": policy,
               "load": bench.load_info}
    write_results(out, results)
    if "load" in settings.sections and service is not None and on == "cpu":
        # The planner's model against the levels just measured (it times the target's passes here,
        # on the replica's core, with the service stopped): its table goes into the report.
        print("checking the capacity planner (cluster/plan.py) against the load levels...", flush=True)
        results["planner"] = check_planner(results, str(out))
        write_report(out, results)
    return out


def measure_on_service(bench: Bench) -> tuple[list[dict], list[dict]]:
    """The sections that run on the service, in order; returns the policy's view after the greedy
    section and each component's memory after the last section."""
    sections = bench.s.sections
    bench.warm_up()
    if "greedy" in sections:
        bench.greedy()
    policy = policy_rows(bench.client.stats())  # the view that routed the measured requests, before load
    if "score" in sections:
        bench.score()
    if "sampling" in sections:
        bench.sampling()
    if "load" in sections:
        bench.load()
    return policy, resident_memory(own_cluster=bench.own_cluster)


def unbatched_overrides(overrides: dict) -> dict:
    """The service's config overrides with batching off on the target replicas and draft workers."""
    unbatched = copy.deepcopy(overrides)
    merge_into(unbatched, copy.deepcopy(UNBATCHED))
    return unbatched


def target_config(overrides: dict) -> TargetConfig:
    """The target replicas' config in the service this run starts (its cores and threads pin the peers)."""
    return service_config(overrides).target


def service_config(overrides: dict) -> ServiceConfig:
    args = serve_config(default_config_path(), overrides=overrides)["applications"][0]["args"]
    return ServiceConfig.model_validate(args)


def write_results(out: Path, results: dict) -> None:
    """Derive the figures from the samples, then write results.json, the plots and report.md."""
    results["figures"] = derive(results["meta"], [Sample.from_record(r) for r in results["samples"]], results["memory"],
                                results.get("load"))
    write_plots(results["figures"], results["meta"], out)
    write_report(out, results)
    print(summary(results))
    print(f"\nreport: {out / 'report.md'}", flush=True)


def write_report(out: Path, results: dict) -> None:
    """results.json and report.md (with the plots already in ``out``)."""
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "report.md").write_text(render_report(results, sorted(p.name for p in out.glob("*.png"))))


def rerender(run_dir: Path) -> None:
    """A past run's figures, plots and report again from its saved samples (after a report change)."""
    results = json.loads((run_dir / "results.json").read_text())
    write_results(run_dir, {k: results[k] for k in ("meta", "samples", "memory", "policy", "load", "planner")
                            if k in results})


def policy_rows(stats) -> list[dict]:
    """The routing policy's view at the end of the run (GetStats): what it learnt from the traffic."""
    return [{"task": t.task, "draft": t.draft, "alpha": t.alpha, "c": t.cost_ratio, "k": t.k,
             "expected_speedup": t.expected_speedup, "decision": t.decision, "reason": t.reason,
             "scored_tokens": t.scored_tokens} for t in stats.tasks]


def _meta(settings: BenchSettings, zoo: Zoo, held_out, started: datetime, target: TargetConfig, device: dict) -> dict:
    return {
        "command": " ".join(["specserve", *sys.argv[1:]]) if sys.argv[0].endswith("specserve") else " ".join(sys.argv),
        "started": started.isoformat(timespec="seconds"),
        "seconds": round((datetime.now(timezone.utc) - started).total_seconds(), 1),
        "zoo": {"preset": zoo.manifest["preset"], "path": str(zoo.root),
                "target_parameters": zoo.manifest["target"]["parameters"]},
        "tasks": zoo.tasks,
        "drafts": zoo.draft_names,
        "task_drafts": {task: zoo.default_draft(task) for task in zoo.tasks},
        "k": settings.k,
        "max_tokens": settings.max_tokens,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()},
        "prompts": {"checked": held_out.checked, "found_in_training": held_out.found_in_training,
                    "available": {t: len(p) for t, p in held_out.by_task.items()}},
        "goals": asdict(Goals()),
        "provenance": provenance(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__, "transformers": transformers.__version__, "ray": ray.__version__,
                    "in_process_core": REPLICA_CORE, "target_cpus": list(target.cpus), "target_threads": target.threads,
                    "unix_time": time.time(), "device": device},
    }
