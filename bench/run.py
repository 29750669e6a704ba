"""`specserve bench`: one run, every section against the same service and the same in-process models.

Sections, in order (each prints what it does; a progress bar counts decodes):
  warm-up   one decode per path, then routed requests so the policy starts from traffic
  greedy    per held-out prompt, every path of samples.GREEDY_PATHS back to back, outputs compared
  score     every draft scored against the target's greedy output of every prompt (alpha matrix)
  sampling  per temperature, the task's draft against target-only with the same seed
  load      1, 2, 4, 8 concurrent clients, mixed tasks, speculation OFF then AUTO (order alternates)
  memory    resident memory of the target replica, draft workers and router
Then results.json (settings, raw samples, figures), report.md and the plots.
"""

from __future__ import annotations

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

from specserve.cluster.bringup import merge_into, start_service
from specserve.cluster.client import SpecServeClient
from specserve.cluster.demo import ensure_zoo
from specserve.cluster.local import zoo_engine
from specserve.workers.drafting import score_continuation
from specserve.workers.engine import SpecEngine
from specserve.workers.prompt import encode_prompt
from specserve.workers.grpc_host import Device
from specserve.workers.zoo.zoo import Zoo

from . import load as load_section
from .decoders import decode_engine, decode_hf_assisted, decode_service, service_request
from .figures import derive
from .memory import resident_memory
from .plots import write_plots
from .prompts import load_prompts
from .report import render_report, summary
from .samples import (AUTO, ENGINE_OFF, ENGINE_TASK, GREEDY_PATHS, HF_ASSISTED, OFF, ROUTED, TASK, Sample)
from .settings import BenchSettings, Goals

REPLICA_CORE = 0  # the in-process paths run where deploy/serve_config.yaml pins the target replica


class Bench:
    def __init__(self, settings: BenchSettings, zoo: Zoo, prompts: dict[str, list[str]], client: SpecServeClient,
                 engine: SpecEngine, device: Device) -> None:
        self.s, self.zoo, self.prompts, self.client, self.engine, self.device = settings, zoo, prompts, client, engine, device
        self.samples: list[Sample] = []
        self.bar = tqdm(total=self._decodes(), unit="decode", desc="bench", file=sys.stderr, dynamic_ncols=True)

    def _decodes(self) -> int:
        tasks = len(self.zoo.tasks)
        paths = len(GREEDY_PATHS) - (0 if self.s.peer else 1)
        return (tasks * (self.s.warm_up + paths)
                + tasks * self.s.prompts * self.s.repeats * paths
                + tasks * len(self.s.temperatures) * self.s.sampled_prompts * 2
                + len(self.s.concurrency) * 2 * self.s.load_requests)

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
                positions, matches = self.device.executor.submit(
                    score_continuation, self.engine.drafts[draft], prompt_ids + off.token_ids, len(prompt_ids)).result()
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
        self.section("load", f"{', '.join(map(str, self.s.concurrency))} concurrent clients, mixed tasks, "
                             f"{self.s.load_requests} requests per level and mode")
        requests = load_section.mixed_requests({t: self.measured(t) for t in self.zoo.tasks}, self.s.load_requests)
        for n, clients in enumerate(self.s.concurrency):
            level: dict[str, list[Sample]] = {}
            for mode in load_section.MODES[::-1] if n % 2 else load_section.MODES:
                level[mode] = load_section.run_level(self.client, requests, clients, mode, self.s.max_tokens,
                                                     self.bar.update)
            reference = {(s.task, s.prompt): s.token_ids for s in level[OFF]}
            for sample in level[AUTO]:
                sample.identical = sample.token_ids == reference[(sample.task, sample.prompt)]
            self.samples.extend(level[OFF] + level[AUTO])

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

    device = Device(threads=1, cpus=(REPLICA_CORE,))  # one thread, like the target replica
    engine = device.executor.submit(zoo_engine, zoo, zoo.draft_names, 1).result()
    service = None
    if settings.address is None:
        print("starting the embedded cluster (Ray, Serve, target replica, draft pool)...", flush=True)
        overrides = {"models": {"zoo": str(zoo.root)}}
        merge_into(overrides, settings.service_overrides)
        service = start_service(port=0, overrides=overrides)
    client = SpecServeClient(settings.address or service.address)
    bench = Bench(settings, zoo, held_out.by_task, client, engine, device)
    try:
        bench.warm_up()
        bench.greedy()
        policy = policy_rows(client.stats())  # the view that routed the measured requests, before load
        bench.score()
        bench.sampling()
        bench.load()
        memory = resident_memory(own_cluster=service is not None)
    finally:
        bench.bar.close()
        client.close()
        if service:
            service.stop()
    meta = _meta(settings, zoo, held_out, started)
    write_results(out, {"meta": meta, "samples": [s.record() for s in bench.samples], "memory": memory,
                        "policy": policy})
    return out


def write_results(out: Path, results: dict) -> None:
    """Derive the figures from the samples, then write results.json, the plots and report.md."""
    results["figures"] = derive(results["meta"], [Sample.from_record(r) for r in results["samples"]], results["memory"])
    (out / "results.json").write_text(json.dumps(results, indent=1))
    plots = write_plots(results["figures"], results["meta"], out)
    (out / "report.md").write_text(render_report(results, [p.name for p in plots]))
    print(summary(results))
    print(f"\nreport: {out / 'report.md'}", flush=True)


def rerender(run_dir: Path) -> None:
    """A past run's figures, plots and report again from its saved samples (after a report change)."""
    results = json.loads((run_dir / "results.json").read_text())
    write_results(run_dir, {k: results[k] for k in ("meta", "samples", "memory", "policy") if k in results})


def policy_rows(stats) -> list[dict]:
    """The routing policy's view at the end of the run (GetStats): what it learnt from the traffic."""
    return [{"task": t.task, "draft": t.draft, "alpha": t.alpha, "c": t.cost_ratio, "k": t.k,
             "expected_speedup": t.expected_speedup, "decision": t.decision, "reason": t.reason,
             "scored_tokens": t.scored_tokens} for t in stats.tasks]


def _meta(settings: BenchSettings, zoo: Zoo, held_out, started: datetime) -> dict:
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
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__, "transformers": transformers.__version__, "ray": ray.__version__,
                    "in_process_core": REPLICA_CORE, "unix_time": time.time()},
    }
