"""`specserve host-path`: what the service spends around the forward pass, per process.

The service runs on the host-path zoo (cluster/zoo/host_path.py: a target of about 150k parameters
whose pass costs next to nothing, drafts that are copies of it, a small EAGLE-3 head), so that its
ceiling in tokens/s and its CPU per token are those of the host path: gRPC, protobuf, the router's
bookkeeping, the replica's and the workers' scheduling. At each level of concurrent sessions, for
each path (speculation OFF; ON with the task's draft, the EAGLE-3 head, n-gram lookup, Medusa heads
on the target replica, an MTP module on the draft workers; by name, a task's draft under a
cascade, the MTP module on the target replica), clients stream
greedy requests back to back, and each process's CPU time over the level is read from /proc:
router, target replica, draft workers, Ray's daemons (raylet, GCS, Serve's controller, ...), and the
client (this process: its grpc.aio streams). Per generated token and per round (a target verify
step; a token, target-only).

Then, in this process on the replica's core, the same target in the in-process scheduler
(target-only, N sessions sharing passes: the ceiling without the service) and the in-process
engine (one request at a time, OFF and each proposer), side by side with the service's figures.

With ``--on-zoo`` all of it runs on the zoo itself instead (its trained target and drafts, Medusa
heads and an MTP module distilled beside it on first use): where passes cost what they cost, what each path gains.

    specserve host-path [--zoo demo] [--sessions 1,16,64,256] [--paths off,draft,eagle3,ngram,medusa,mtp] [--on-zoo]
    specserve host-path --on-zoo --sessions 1,16 --paths off,mtp,mtp-replica   # the module where it drafts
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import lzma
import math
import os
import platform
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import grpc
import psutil
import shutil
import signal
import subprocess
import collections
import torch

from specserve.cluster.bringup import merge_into, start_service
from specserve.cluster.commands.common import comma_ints, dotted_overrides
from specserve.cluster.commands.serve import sim_overrides
from specserve.cluster.demo import MEASURED_ON_UNSEEN, ensure_zoo
from specserve.cluster.local import zoo_engine
from specserve.workers.engine import SpecEngine
from specserve.workers.loading import ModelSpec
from specserve.proto.v1 import specserve_pb2 as pb
from specserve.proto.v1 import specserve_pb2_grpc as rpc
from specserve.workers.sampling import SamplingParams
from specserve.workers.batching import Scheduler
from specserve.workers.config import BatchingConfig
from specserve.workers.grpc_host import DEVICE_THREAD, Device
from specserve.workers.sim_device import PRESETS, TARGET, SimConfig
from specserve.workers.kv_pool import Budget, KVPool, KVShape
from specserve.workers.drafting import Cascade
from specserve.workers.proposer_kinds import CASCADE, NGRAM
from specserve.workers.prompt import encode_prompt
from specserve.workers.ragged_pass import PooledSequence
from specserve.workers.request import GenerationParams
from specserve.workers.verifying import TargetSession
from specserve.cluster.zoo.head import HEAD
from specserve.cluster.zoo.host_path import MEDUSA, ensure_host_path_zoo, zoo_heads
from specserve.cluster.zoo.other_tokenizer import OTHER_TOKENIZER, ensure_other_tokenizer_draft
from specserve.workers.heads.mtp import MTP
from specserve.cluster.zoo.zoo import Zoo

from .cli import module_main
from .commands import HOST_PATH
from .faults import inspect
from .memory import component_of
from .settings import REPLICA_CORE, RESULTS_DIR, provenance

# "draft": each request's task draft (a copy of the target here); MEDUSA: heads on the target replica
# (their guesses ride its verify pass); MTP: a module on the draft workers, fed the last hidden states
PATHS = ("off", "draft", HEAD, NGRAM, MEDUSA, MTP)
# Asked for by name, with --on-zoo only: a draft of another tokenizer (its own BPE, trained on the
# zoo target's text; cluster/zoo/other_tokenizer.py). The host-path zoo's drafts are copies of its
# target, which a draft of another vocabulary cannot be.
ON_ZOO_PATHS = (OTHER_TOKENIZER,)
# Asked for by name: each request's task draft under a cascade (prompt lookup's guesses, which it
# verifies as it drafts: workers/drafting.py), beside "draft", its draft alone; the MTP module served
# by the target replica (models.on_replica: it drafts after each verify pass), beside MTP, the same
# module on the draft workers.
MTP_ON_REPLICA = "mtp-replica"
NAMED_PATHS = (CASCADE, MTP_ON_REPLICA)
COMPONENTS = ("router", "target replica", "draft worker", "ray daemons", "client")
HOST_PATH_MODELS = ("drafts of one layer computing its function bit for bit; an EAGLE-3 head; Medusa heads; an "
                    "MTP module")
GOAL_US_PER_TOKEN = 50  # the bar for each of router, replica and draft worker at 64 sessions


@dataclass(frozen=True)
class HostPathSettings:
    zoo: str = "demo"  # the zoo whose tokenizer, prompts and classifier the host-path zoo takes
    sessions: tuple[int, ...] = (1, 16, 64, 256)
    paths: tuple[str, ...] = PATHS
    max_tokens: int = 64  # per request
    k: int = 4  # draft tokens a round, ON
    min_tokens: int = 4096  # per level and path at least this many tokens (and two requests a session)
    out: Path = RESULTS_DIR
    profile_sessions: int | None = 64  # levels of this many sessions are sampled with py-spy (None: none)
    stream_interval: int = 1  # the router's stream_interval_tokens
    # router.replicas: router processes sharing the client port. With more than one, each client
    # session has a connection of its own, so the kernel spreads them over the processes.
    router_replicas: int = 1
    service_overrides: dict = field(default_factory=dict)  # --set: fields of the service's config, over the bench's
    # On ``zoo`` itself (its trained target and drafts, Medusa heads distilled beside it), not the
    # host-path zoo: where the models' passes cost what they cost, the paths' speedups.
    on_zoo: bool = False
    # A preset of workers/sim_device.py: every model process (and the in-process scheduler) on a
    # simulated device with that accelerator's timing. None: the models' passes as they run here.
    sim: str | None = None


@dataclass
class Level:
    """One level of one path through the service."""

    path: str
    sessions: int
    requests: int = 0
    tokens: int = 0
    rounds: int = 0  # target verify steps (target_passes), summed over requests
    chunks: int = 0  # stream messages the clients received: the router's writes to them
    pass_sessions: float = 0.0  # sessions in a target pass, mean over the level's latest steps (GetStats)
    accepted: int = 0
    proposed: int = 0
    seconds: float = 0.0
    cpu_seconds: dict[str, float] = field(default_factory=dict)  # by component
    device_seconds: dict[str, float] = field(default_factory=dict)  # of which on device threads (the passes)
    processes: dict[str, int] = field(default_factory=dict)  # how many processes each component had
    # By worker kind (target, draft), over its processes: seconds their devices were busy with
    # passes (simulated: the modelled times), the math's overrun of them, and how many devices.
    busy_seconds: dict[str, float] = field(default_factory=dict)
    overrun_seconds: dict[str, float] = field(default_factory=dict)
    devices: dict[str, int] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def us_per_token(self, component: str) -> float:
        return 1e6 * self.cpu_seconds.get(component, 0.0) / max(self.tokens, 1)

    def host_us_per_token(self, component: str) -> float:
        """Off the device thread: what the process spends around its passes."""
        spent = self.cpu_seconds.get(component, 0.0) - self.device_seconds.get(component, 0.0)
        return 1e6 * spent / max(self.tokens, 1)

    def us_per_round(self, component: str) -> float:
        return 1e6 * self.cpu_seconds.get(component, 0.0) / max(self.rounds, 1)

    def busy_share(self, kind: str) -> float:
        """The share of the level's time the devices of ``kind`` spent in passes (mean over them)."""
        return self.busy_seconds.get(kind, 0.0) / max(self.seconds * self.devices.get(kind, 0), 1e-9)

    def device_us_per_token(self, kind: str = "target", modelled: bool = False) -> float:
        """Device time per generated token: the busy seconds of ``kind``'s devices, per token (with
        ``modelled``, less the math's overrun: what the simulated accelerator itself would take)."""
        busy = self.busy_seconds.get(kind, 0.0) - (self.overrun_seconds.get(kind, 0.0) if modelled else 0.0)
        return 1e6 * busy / max(self.tokens, 1)


# ---- the processes ---------------------------------------------------------------------------


def component(process: psutil.Process) -> str:
    """Which column a process's CPU goes in: the control replica's (the registry, the pool's
    supervision) goes with Ray's daemons, as the service's upkeep."""
    found = component_of(" ".join(process.cmdline()))
    return found if found in COMPONENTS else "ray daemons"


def process_table() -> dict[int, tuple[psutil.Process, str]]:
    """This process (the client) and every process it started (the embedded cluster's)."""
    table = {os.getpid(): (psutil.Process(), "client")}
    for process in psutil.Process().children(recursive=True):
        try:
            table[process.pid] = (process, component(process))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return table


def cpu_now(table: dict[int, tuple[psutil.Process, str]]) -> dict[int, tuple[float, float]]:
    """Per process, its CPU seconds so far: all its threads', and its device threads' (the passes)."""
    seconds = {}
    for pid, (process, _) in table.items():
        try:
            times = process.cpu_times()
            device = sum(t.user_time + t.system_time for t in process.threads() if _thread_name(pid, t.id) == DEVICE_THREAD)
            seconds[pid] = (times.user + times.system, device)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return seconds


def _thread_name(pid: int, tid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return ""


def cpu_by_component(table, before: dict[int, tuple[float, float]],
                     after: dict[int, tuple[float, float]]) -> tuple[dict, dict, dict]:
    """Per component, CPU seconds between two readings: in all, on its device threads, and its processes."""
    used: dict[str, float] = {}
    device: dict[str, float] = {}
    counted: dict[str, int] = {}
    for pid, (total, passes) in after.items():
        name = table[pid][1]
        then_total, then_passes = before.get(pid, (0.0, 0.0))
        used[name] = used.get(name, 0.0) + total - then_total
        device[name] = device.get(name, 0.0) + passes - then_passes
        counted[name] = counted.get(name, 0) + 1
    return used, device, counted


def device_readings(address: str) -> dict[str, tuple[str, float, float]]:
    """Per worker (by id): its kind and its device's busy and overrun seconds so far (its Inspect)."""
    with grpc.insecure_channel(address) as channel:
        workers = rpc.SpecServeStub(channel).GetStats(pb.GetStatsRequest()).workers
    readings = {}
    for worker in workers:
        try:
            state = inspect(worker.kind, worker.address)
        except grpc.RpcError:  # a worker gone since the registry listed it
            continue
        readings[worker.worker_id] = (worker.kind, state.device_busy_seconds, state.device_overrun_seconds)
    return readings


def device_by_kind(before: dict, after: dict) -> tuple[dict, dict, dict]:
    """Per kind, between two readings: busy seconds, overrun seconds and devices (those in both)."""
    busy: dict[str, float] = {}
    overrun: dict[str, float] = {}
    devices: dict[str, int] = {}
    for worker, (kind, was_busy, was_over) in before.items():
        if worker in after:
            busy[kind] = busy.get(kind, 0.0) + after[worker][1] - was_busy
            overrun[kind] = overrun.get(kind, 0.0) + after[worker][2] - was_over
            devices[kind] = devices.get(kind, 0) + 1
    return busy, overrun, devices


# ---- where the CPU goes -----------------------------------------------------------------------

PROFILED = ("router", "target replica", "draft worker")
OUR_CODE = ("(router/", "(workers/", "(cluster/", "(proto/")
LINE = re.compile(r":\d+\)$")  # a frame's line number: one function's lines count as one


class Profiles:
    """py-spy, sampling only the threads that hold the GIL (Python's own CPU), on one process of each
    profiled component while a level runs; stopped (SIGINT: it writes its samples) when it ends."""

    def __init__(self, table, out: Path) -> None:
        self.spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        self.out = out
        self.targets = {}
        for pid, (_, name) in sorted(table.items()):
            if name in PROFILED and name not in self.targets.values():
                self.targets[pid] = name
        self.running: list[tuple[subprocess.Popen, str, Path]] = []

    @property
    def available(self) -> bool:
        return Path(self.spy).exists()

    def start(self, label: str) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        for pid, name in self.targets.items():
            path = self.out / f"{label}-{name.replace(' ', '-')}.txt"
            process = subprocess.Popen([self.spy, "record", "--gil", "--nonblocking", "-r", "250", "-f", "raw",
                                        "-o", str(path), "-p", str(pid)], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
            self.running.append((process, name, path))

    def stop(self) -> dict[str, dict]:
        found = {}
        for process, name, path in self.running:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
            if path.exists():
                found[name] = summarize(path)
                _compress(path)
        self.running = []
        return found


def _compress(path: Path) -> None:
    """py-spy's raw samples (flamegraph.pl and speedscope read them) as .xz: a tenth of the bytes."""
    with lzma.open(path.with_suffix(path.suffix + ".xz"), "wt") as out:
        out.write(path.read_text())
    path.unlink()


def summarize(path: Path, top: int = 12) -> dict:
    """Of py-spy's raw samples: the functions holding the GIL most (self), and ours by inclusive share."""
    own, inclusive, total = collections.Counter(), collections.Counter(), 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [LINE.sub(")", frame) for frame in stack.split(";")]
        total += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            if any(part in frame for part in OUR_CODE):
                inclusive[frame] += int(count)
    share = lambda counter: [(frame, round(n / total, 4)) for frame, n in counter.most_common(top)]  # noqa: E731
    return {"samples": total, "self": share(own), "ours_inclusive": share(inclusive)}


# ---- the clients -----------------------------------------------------------------------------


def request_for(path: str, prompt: str, task: str, zoo: Zoo, settings: HostPathSettings) -> pb.GenerateRequest:
    request = pb.GenerateRequest(prompt=prompt, max_tokens=settings.max_tokens, temperature=0.0, task=task)
    if path == "off":
        request.speculation = pb.SPECULATION_OFF
        return request
    request.speculation = pb.SPECULATION_ON
    request.draft = zoo.default_draft(task) if path == "draft" else path
    request.k = settings.k
    return request


async def run_level(address: str, requests: list[pb.GenerateRequest], sessions: int, per_session: int,
                    level: Level, connections: int = 1) -> list[list[int]]:
    """``sessions`` clients each streaming ``per_session`` requests back to back, over ``connections``
    connections; the outputs in order."""
    outputs: list[list[int]] = [[] for _ in range(sessions * per_session)]
    # A local subchannel pool each: channels to one address otherwise share one connection.
    channels = [grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(max(1, min(connections, sessions)))]
    try:
        stubs = [rpc.SpecServeStub(channel) for channel in channels]
        stub = stubs[0]

        async def client(i: int) -> None:
            stub = stubs[i % len(stubs)]
            for j in range(per_session):
                n = i * per_session + j
                async for chunk in stub.GenerateStream(requests[n % len(requests)]):
                    outputs[n].extend(chunk.token_ids)
                    level.chunks += 1
                    if chunk.finish_reason:
                        level.rounds += chunk.stats.target_passes
                        level.accepted += chunk.stats.accepted_tokens
                        level.proposed += chunk.stats.proposed_tokens
                level.requests += 1
                level.tokens += len(outputs[n])

        await asyncio.gather(*(client(i) for i in range(sessions)))
        stats = await stub.GetStats(pb.GetStatsRequest())  # one router's view of the passes it stepped in
        level.pass_sessions = next((p.mean_sessions for p in stats.passes if p.kind == "target"), 0.0)
    finally:
        for channel in channels:
            await channel.close()
    return outputs


def measure_service(zoo: Zoo, settings: HostPathSettings, progress, out: Path,
                    heads: dict[str, Path]) -> tuple[list[Level], dict, dict]:
    widest = max(settings.sessions)
    room = {"max_sessions": 2 * widest, "kv_cache_mib": 1024, "batching": {"max_sessions_per_pass": widest}}
    router = copy.deepcopy(MEASURED_ON_UNSEEN["router"]) | {"max_concurrent_requests": 2 * widest, "http_port": None,
                                                            "stream_interval_tokens": settings.stream_interval,
                                                            "replicas": settings.router_replicas}
    overrides = {"models": {"zoo": str(zoo.root), "drafts": {name: str(where) for name, where in heads.items()},
                            "on_replica": [name for name in heads if name == MTP_ON_REPLICA]},
                 "target": copy.deepcopy(room),
                 "draft_pool": copy.deepcopy(room), "router": router}
    if settings.sim is not None:  # every model process on a simulated device of that preset
        merge_into(overrides, sim_overrides(settings.sim))
    merge_into(overrides, copy.deepcopy(settings.service_overrides))
    service = start_service(port=0, overrides=overrides)
    prompts = [(task, p) for task in zoo.tasks for p in zoo.prompts(task)[:8]]
    connections = 1 if settings.router_replicas == 1 else max(settings.sessions)
    levels, identical, profiles = [], {}, {}
    try:
        table = process_table()
        spy = Profiles(table, out / "profiles")
        reference: dict[int, list[int]] = {}
        # One untimed request a path first: whatever a first request pays (opening streams, a
        # worker's first pass) must not fall on the first level.
        for path in settings.paths:
            warm = [request_for(path, p, t, zoo, settings) for t, p in prompts[:2]]
            asyncio.run(run_level(service.address, warm, 2, 1, Level(path, 2), connections))
        for sessions in settings.sessions:
            per_session = max(2, math.ceil(settings.min_tokens / (sessions * settings.max_tokens)))
            for path in settings.paths:
                requests = [request_for(path, p, t, zoo, settings) for t, p in prompts]
                level = Level(path, sessions)
                devices = device_readings(service.address)
                before, start = cpu_now(table), time.perf_counter()
                outputs = asyncio.run(run_level(service.address, requests, sessions, per_session, level, connections))
                level.seconds = time.perf_counter() - start
                level.cpu_seconds, level.device_seconds, level.processes = cpu_by_component(table, before,
                                                                                            cpu_now(table))
                level.busy_seconds, level.overrun_seconds, level.devices = device_by_kind(
                    devices, device_readings(service.address))
                if sessions == settings.profile_sessions and spy.available:  # again, sampled: the sampler
                    spy.start(f"{path}-{sessions}")  # takes CPU of its own, so not in the figures above
                    asyncio.run(run_level(service.address, requests, sessions, per_session, Level(path, sessions),
                                          connections))
                    profiles[f"{path} {sessions}"] = spy.stop()
                levels.append(level)
                # Lossless on the way: every path's output of a prompt is the target-only one.
                firsts = {n % len(requests): out for n, out in enumerate(outputs)}
                for n, out in firsts.items():
                    reference.setdefault(n, out)
                    identical.setdefault(path, [0, 0])
                    identical[path][0] += out == reference[n]
                    identical[path][1] += 1
                progress(level)
    finally:
        service.stop()
    return levels, identical, profiles


# ---- the same models in this process ---------------------------------------------------------


def pinned_here() -> set[int]:
    """Pin this process to the replica's core (as the service pins the replica), one torch thread."""
    before = os.sched_getaffinity(0)
    if REPLICA_CORE in before:
        os.sched_setaffinity(0, {REPLICA_CORE})
    torch.set_num_threads(1)
    return before


def scheduler_target_only(zoo: Zoo, sessions: int, max_tokens: int, sim: str | None = None) -> dict:
    """Target-only through one in-process scheduler, ``sessions`` at once sharing its passes (on a
    simulated device of preset ``sim``, if given, as the service's replica)."""
    engine = zoo_engine(zoo, [])
    target, tokenizer = engine.target, engine.tokenizer
    prompts = [encode_prompt(tokenizer, p) for task in zoo.tasks for p in zoo.prompts(task)[:8]]
    batch = [prompts[i % len(prompts)] for i in range(sessions)]
    pool = KVPool(KVShape.of(target), Budget(2**28))
    device = Device(1, (REPLICA_CORE,), SimConfig(preset=sim) if sim else None)
    scheduler = Scheduler(target, pool, device, BatchingConfig(max_sessions_per_pass=sessions),
                          timing=device.timing("target", TARGET))

    async def run() -> None:
        runs = [TargetSession(PooledSequence(pool.take(len(p) + max_tokens + 1), p), SamplingParams(),
                              torch.Generator().manual_seed(i)) for i, p in enumerate(batch)]
        await asyncio.gather(*(scheduler.run(s.decode(max_tokens)) for s in runs))
        for s in runs:
            pool.give_back(s.sequence.region)

    asyncio.run(run())  # warm
    rounds = max(1, math.ceil(4096 / (sessions * max_tokens)))
    me = {os.getpid(): (psutil.Process(), "in process")}
    busy = device.busy_seconds
    before, start = cpu_now(me), time.perf_counter()
    for _ in range(rounds):
        asyncio.run(run())
    seconds, ((cpu, on_device),) = time.perf_counter() - start, cpu_now(me).values()
    cpu, on_device = cpu - before[os.getpid()][0], on_device - before[os.getpid()][1]
    tokens, busy = rounds * sessions * max_tokens, device.busy_seconds - busy
    return {"sessions": sessions, "tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds,
            "cpu_us_per_token": 1e6 * cpu / tokens, "device_us_per_token": 1e6 * on_device / tokens,
            "busy_share": busy / seconds, "busy_us_per_token": 1e6 * busy / tokens}


def engine_single_stream(zoo: Zoo, settings: HostPathSettings, heads: dict[str, Path]) -> list[dict]:
    """One request at a time through the in-process engine: OFF and each proposer (k as the service's;
    with ``settings.sim``, every model's passes on one simulated device of that preset)."""
    engine = SpecEngine.load(ModelSpec(str(zoo.target_dir)), {name: ModelSpec(str(zoo.draft_dir(name)))
                                                              for name in zoo.draft_names if name not in heads}
                             | {name: ModelSpec(str(where)) for name, where in heads.items()},
                             on_verifier=[name for name in heads if name == MTP_ON_REPLICA])
    if settings.sim is not None:  # its models on one simulated device of the service's preset
        engine.simulate(SimConfig(preset=settings.sim))
    router = settings.service_overrides.get("router", {})  # a cascade as the router's (--set)
    engine.proposers.cascade = Cascade(router.get("cascade_guesses", engine.proposers.cascade.guesses),
                                       router.get("cascade_min_p", engine.proposers.cascade.min_p))
    rows = []
    prompts = [(task, encode_prompt(engine.tokenizer, p)) for task in zoo.tasks for p in zoo.prompts(task)[:4]]
    for path in settings.paths:
        tokens, passes = 0, 0
        cpu, start = time.process_time(), time.perf_counter()
        for task, ids in prompts:
            draft = None if path == "off" else zoo.default_draft(task) if path == "draft" else path
            params = GenerationParams(max_tokens=settings.max_tokens, speculation=draft is not None, k=settings.k)
            members = (zoo.default_draft(task),) if path == CASCADE else ()
            done = engine.generate(ids, params, draft=draft, members=members).complete()
            tokens += len(done.token_ids)
            passes += done.stats.target_passes
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        rows.append({"path": path, "tokens": tokens, "rounds": passes, "tokens_per_second": tokens / seconds,
                     "cpu_us_per_token": 1e6 * cpu / tokens})
    return rows


# ---- the report ------------------------------------------------------------------------------


def report(levels: list[Level], in_process: dict, identical: dict, meta: dict) -> str:
    lines = [f"# Host path: {meta['when']}", "",
             f"Zoo: {meta['zoo']} (target {meta['target_parameters']:,} parameters; {meta.get('models', HOST_PATH_MODELS)}). "
             f"Greedy, {meta['max_tokens']} tokens a request, k = {meta['k']} ON. "
             f"Command: `{meta['command']}`. Machine: {meta['machine']}.", "",
             "CPU time of each process over a level (user + system, from /proc), per generated token and per round "
             "(a verify step; target-only, a token); for the replica and the draft workers also what they spend off "
             "their device threads (the passes: on this CPU, the model's compute). `ray` is Ray's own daemons (raylet, GCS, Serve controller, "
             "agents); `client` is this bench's grpc.aio clients; `tokens/chunk`, the tokens in each message of a client's "
             "stream (one write of the router's); `sessions/pass`, the sessions in a target pass (the replica's "
             "passes the level's latest steps ran in).", "",
             "## Through the service", "",
             "| path | sessions | tokens/s | rounds/token | tokens/chunk | sessions/pass | alpha | router us/tok | replica us/tok | draft us/tok "
             "| ray us/tok | client us/tok | total us/tok | router us/round | replica us/round | draft us/round "
             "| replica off its device thread us/tok | draft off its device thread us/tok |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for lv in levels:
        total = sum(lv.us_per_token(c) for c in COMPONENTS)
        alpha = f"{lv.accepted / lv.proposed:.2f}" if lv.proposed else "-"
        lines.append(f"| {lv.path} | {lv.sessions} | {lv.tokens_per_second:,.0f} | {lv.rounds / max(lv.tokens, 1):.2f} "
                     f"| {lv.tokens / max(lv.chunks, 1):.2f} | {lv.pass_sessions:.1f} | {alpha} | " + " | ".join(f"{lv.us_per_token(c):,.0f}" for c in COMPONENTS)
                     + f" | {total:,.0f} | " + " | ".join(f"{lv.us_per_round(c):,.0f}" for c in COMPONENTS[:3])
                     + f" | {lv.host_us_per_token('target replica'):,.0f} | {lv.host_us_per_token('draft worker'):,.0f} |")
    by = {(lv.path, lv.sessions): lv for lv in levels}
    ceiling = {path: max((lv.tokens_per_second for lv in levels if lv.path == path), default=0.0) for path in meta["paths"]}
    lines += ["", "Ceiling (the most tokens/s over the levels): "
              + ", ".join(f"{path} {value:,.0f}" for path, value in ceiling.items()) + ".", ""]
    lines += ["What one router process sustains: its Python runs on one core (one event loop under the GIL), "
              "so at its CPU per token it serves at most 1,000,000 / (router us/token) tokens/s; per path, "
              "at the level where a token cost it least: "
              + ", ".join(router_bound(levels, path) for path in meta["paths"]) + ".", ""]
    if "off" in meta["paths"]:
        lines += ["## ON over OFF through the service", "", "| sessions | " + " | ".join(p for p in meta["paths"] if p != "off") + " |",
                  "|---|" + "---|" * (len(meta["paths"]) - 1)]
        for n in meta["sessions"]:
            off = by.get(("off", n))
            cells = [f"{by[(p, n)].tokens_per_second / off.tokens_per_second:.2f}x" if off and (p, n) in by else "-"
                     for p in meta["paths"] if p != "off"]
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## The goal: at most 50 us of CPU a generated token in each process, 64 sessions", ""]
    for lv in levels:
        if lv.sessions == 64:
            worst = max(("router", "target replica", "draft worker"), key=lv.us_per_token)
            lines.append(f"- {lv.path}: router {lv.us_per_token('router'):,.0f}, replica "
                         f"{lv.us_per_token('target replica'):,.0f} ({lv.host_us_per_token('target replica'):,.0f} off "
                         f"its device thread), draft worker {lv.us_per_token('draft worker'):,.0f} "
                         f"({lv.host_us_per_token('draft worker'):,.0f}) us/token: "
                         f"{'met' if lv.us_per_token(worst) <= GOAL_US_PER_TOKEN else 'missed'} (worst: {worst})")
    lines += ["", "## The same target in this process (pinned to the replica's core, one thread)", "",
              "| sessions | scheduler tokens/s | CPU us/token | of which its device thread | service OFF tokens/s "
              "| service / in process |",
              "|---|---|---|---|---|---|"]
    for row in in_process["scheduler"]:
        off = by.get(("off", row["sessions"]))
        ratio = f"{off.tokens_per_second / row['tokens_per_second']:.2f}x" if off else "-"
        lines.append(f"| {row['sessions']} | {row['tokens_per_second']:,.0f} | {row['cpu_us_per_token']:,.0f} | "
                     f"{row.get('device_us_per_token', 0):,.0f} | {off.tokens_per_second if off else 0:,.0f} | {ratio} |")
    lines += ["", "One request at a time, the in-process engine (each proposer over OFF) against the service at 1 session:", "",
              "| path | engine tokens/s | engine CPU us/token | engine ON/OFF | service tokens/s | service ON/OFF |",
              "|---|---|---|---|---|---|"]
    engine_off = next((r for r in in_process["engine"] if r["path"] == "off"), None)
    for row in in_process["engine"]:
        service = by.get((row["path"], 1))
        service_off = by.get(("off", 1))
        # A ratio over OFF only where OFF ran (``--paths draft`` alone has none).
        engine_ratio = f"{row['tokens_per_second'] / engine_off['tokens_per_second']:.2f}x" if engine_off else "-"
        service_ratio = (f"{service.tokens_per_second / service_off.tokens_per_second:.2f}x"
                         if service and service_off else "-")
        lines.append(f"| {row['path']} | {row['tokens_per_second']:,.0f} | {row['cpu_us_per_token']:,.0f} | "
                     f"{engine_ratio} | {service.tokens_per_second if service else 0:,.0f} | {service_ratio} |")
    lines += ["", "Greedy outputs identical to target-only (each prompt's first output per path, all levels): "
              + ", ".join(f"{path} {same}/{total}" for path, (same, total) in identical.items()) + "."]
    return "\n".join(lines) + "\n"


def device_report(levels: list[Level], in_process: dict, meta: dict) -> str:
    """The devices' side: how busy they were, their time per token, and each process's CPU per token
    against it (the host keeps up where every process's is below the target device's)."""
    which = f"simulated, preset {meta['sim']}" if meta.get("sim") else "this host: the passes as they ran"
    lines = ["", f"## The devices ({which})", "",
             "Busy: the share of the level's wall time each kind's devices spent in passes (mean over them; "
             "simulated: the passes' modelled times, or the real math's where it took longer, workers/sim_device.py). "
             "Device us/token: the target devices' modelled time per generated token (what the accelerator would "
             "take). Overrun: the real math's time beyond the modelled, as a share of the busy time (above a few "
             "percent the simulation runs slower than the device it models: this host's math is the bound). The host "
             "keeps up where each process's CPU per token is below the target device's time per token.", "",
             "| path | sessions | tokens/s | target busy | draft busy | target device us/tok | overrun | router us/tok "
             "| replica us/tok | replica off device | draft us/tok | draft off device | host keeps up |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for lv in levels:
        device = lv.device_us_per_token("target", modelled=True)
        over = sum(lv.overrun_seconds.values()) / max(sum(lv.busy_seconds.values()), 1e-9)
        spent = {"router": lv.us_per_token("router"), "replica": lv.us_per_token("target replica"),
                 "draft": lv.us_per_token("draft worker") / max(lv.processes.get("draft worker", 1), 1)}
        worst = max(spent, key=spent.get)
        lines.append(f"| {lv.path} | {lv.sessions} | {lv.tokens_per_second:,.0f} | {lv.busy_share('target'):.0%} "
                     f"| {lv.busy_share('draft'):.0%} | {device:,.0f} | {over:.0%} | {spent['router']:,.0f} "
                     f"| {spent['replica']:,.0f} | {lv.host_us_per_token('target replica'):,.0f} "
                     f"| {lv.us_per_token('draft worker'):,.0f} | {lv.host_us_per_token('draft worker'):,.0f} "
                     f"| {'yes' if spent[worst] < device else 'no: ' + worst} |")
    lines += ["", "Draft us/tok sums the draft workers; the check takes one worker's share (each has its own core on a "
              "GPU node).",
              "", "In process, the target alone through one scheduler on the same device:", "",
              "| sessions | tokens/s | busy | busy us/tok (overrun included) | CPU us/tok | service OFF / in process |",
              "|---|---|---|---|---|---|"]
    by = {(lv.path, lv.sessions): lv for lv in levels}
    for row in in_process["scheduler"]:
        off = by.get(("off", row["sessions"]))
        ratio = f"{off.tokens_per_second / row['tokens_per_second']:.2f}x" if off else "-"
        lines.append(f"| {row['sessions']} | {row['tokens_per_second']:,.0f} | {row.get('busy_share', 0):.0%} "
                     f"| {row.get('busy_us_per_token', 0):,.0f} | {row['cpu_us_per_token']:,.0f} | {ratio} |")
    return "\n".join(lines) + "\n"


def router_bound(levels: list[Level], path: str) -> str:
    """The most tokens/s one router core could serve on ``path``, at its cheapest level."""
    measured = [lv for lv in levels if lv.path == path and lv.us_per_token("router") > 0]
    if not measured:
        return f"{path} -"
    best = min(measured, key=lambda lv: lv.us_per_token("router"))
    return f"{path} {1e6 / best.us_per_token('router'):,.0f} ({best.sessions} sessions)"


def profile_report(profiles: dict) -> str:
    if not profiles:
        return ""
    lines = ["", "## Where each process's Python time goes (py-spy, GIL-holding samples)", "",
             "Per level, per process: our functions by inclusive share of its samples; then the frames that hold "
             "the GIL themselves most.", ""]
    for level, by_process in profiles.items():
        for name, summary in by_process.items():
            lines.append(f"**{level} sessions, {name}** ({summary['samples']} samples): "
                         + "; ".join(f"{frame} {share:.0%}" for frame, share in summary["ours_inclusive"][:8]))
            lines.append("")
            lines.append("self: " + "; ".join(f"{frame} {share:.0%}" for frame, share in summary["self"][:8]))
            lines.append("")
    return "\n".join(lines)


def run(settings: HostPathSettings, command: str) -> Path:
    source = ensure_zoo(settings.zoo)
    zoo = source if settings.on_zoo else ensure_host_path_zoo(source)
    # Only the paths asked for: on a zoo itself, each is distilled on first use (minutes).
    heads = zoo_heads(zoo, tuple(name for name in (MEDUSA, MTP) if name in settings.paths
                                 or name == MTP and MTP_ON_REPLICA in settings.paths)) | {
        name: ensure_other_tokenizer_draft(zoo) for name in settings.paths if name == OTHER_TOKENIZER}
    if MTP_ON_REPLICA in settings.paths:  # the same module, served by the target replica
        heads[MTP_ON_REPLICA] = heads[MTP]
        if MTP not in settings.paths:
            del heads[MTP]
    when = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = settings.out / f"{when}-host-path"
    print(f"host path: zoo {zoo.root}; levels {settings.sessions} sessions x paths {settings.paths}", flush=True)

    def progress(lv: Level) -> None:
        print(f"  {lv.path:7s} {lv.sessions:4d} sessions: {lv.tokens_per_second:8,.0f} tok/s; us/token "
              + ", ".join(f"{c} {lv.us_per_token(c):,.0f}" for c in COMPONENTS), flush=True)

    levels, identical, profiles = measure_service(zoo, settings, progress, out, heads)
    print("in process, on the replica's core:", flush=True)
    affinity = pinned_here()
    try:
        scheduler = [scheduler_target_only(zoo, n, settings.max_tokens, settings.sim) for n in settings.sessions]
        engine = engine_single_stream(zoo, settings, heads)
    finally:
        os.sched_setaffinity(0, affinity)
    in_process = {"scheduler": scheduler, "engine": engine}
    meta = {"when": when, "zoo": str(zoo.root), "target_parameters": zoo.manifest["target"]["parameters"],
            "models": ("the zoo's own trained target and drafts, its EAGLE-3 head, Medusa heads and an MTP module "
                       "distilled for it"
                       if settings.on_zoo else HOST_PATH_MODELS),
            "max_tokens": settings.max_tokens, "k": settings.k, "paths": list(settings.paths), "sim": settings.sim,
            "sessions": list(settings.sessions), "command": command, "provenance": provenance(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"}
    out.mkdir(parents=True, exist_ok=True)
    results = {"meta": meta, "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()},
               "levels": [asdict(lv) | {"tokens_per_second": lv.tokens_per_second} for lv in levels],
               "in_process": in_process, "identical": identical, "profiles": profiles}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    text = (report(levels, in_process, identical, meta) + device_report(levels, in_process, meta)
            + profile_report(profiles))
    (out / "report.md").write_text(text)
    print(text, flush=True)
    print(f"written to {out}", flush=True)
    return out


def register(commands: argparse._SubParsersAction) -> None:
    """Adds `specserve host-path` (the ``specserve.commands`` entry point named host-path)."""
    d = HostPathSettings()
    parser = commands.add_parser(
        HOST_PATH.name, help=HOST_PATH.help,
        description=__doc__.split("\n\n    ")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo", default=d.zoo, help="the zoo (preset or directory) whose tokenizer, prompts and "
                                                     "classifier the host-path zoo takes (default: %(default)s)")
    parser.add_argument("--sessions", type=comma_ints, default=d.sessions, metavar="N,N",
                        help="concurrent sessions per level (default: %(default)s)")
    parser.add_argument("--paths", type=lambda s: tuple(s.split(",")), default=d.paths, metavar="P,P",
                        help=f"of {', '.join(PATHS)} (default: those), {', '.join(NAMED_PATHS)}, and with --on-zoo "
                             f"{', '.join(ON_ZOO_PATHS)}")
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens, help="(default: %(default)s)")
    parser.add_argument("--k", type=int, default=d.k, help="draft tokens a round, ON (default: %(default)s)")
    parser.add_argument("--min-tokens", type=int, default=d.min_tokens,
                        help="tokens per level and path, at least (default: %(default)s)")
    parser.add_argument("--profile-sessions", type=int, default=d.profile_sessions, metavar="N",
                        help="sample the router, the replica and a draft worker with py-spy during the levels of N "
                             "sessions (0: none; default: %(default)s)")
    parser.add_argument("--stream-interval", type=int, default=d.stream_interval, metavar="N",
                        help="the router's stream_interval_tokens: tokens per client message, at least "
                             "(default: %(default)s)")
    parser.add_argument("--router-replicas", type=int, default=d.router_replicas, metavar="N",
                        help="router processes sharing the client port (router.replicas); with more than one, each "
                             "client session connects on its own (default: %(default)s)")
    parser.add_argument("--on-zoo", action="store_true",
                        help="run on the zoo itself (its trained models; Medusa heads distilled beside it on first "
                             "use), not the host-path zoo derived from it: the paths' speedups where passes cost what "
                             "they cost")
    parser.add_argument("--sim", choices=tuple(PRESETS), default=d.sim, metavar="PRESET",
                        help="every model process, and the in-process scheduler, on a simulated device with this "
                             f"preset's timing ({', '.join(PRESETS)}; workers/sim_device.py): the host path held "
                             "against an accelerator's time per token (default: the passes as they run here)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                        help="override a field of the service's config, e.g. target.prefix_caching=false (repeatable; "
                             "VALUE is YAML)")
    parser.add_argument("--out", type=Path, default=d.out, help="results directory (default: %(default)s)")
    parser.set_defaults(run=_run_command)


def _run_command(args: argparse.Namespace) -> int:
    unknown = set(args.paths) - set(PATHS + NAMED_PATHS + ON_ZOO_PATHS)
    if unknown:
        raise ValueError(f"--paths takes {', '.join(PATHS + NAMED_PATHS + ON_ZOO_PATHS)}; got {', '.join(sorted(unknown))}")
    if not args.on_zoo and set(args.paths) & set(ON_ZOO_PATHS):
        raise ValueError(f"--paths {', '.join(ON_ZOO_PATHS)} needs --on-zoo: the host-path zoo's drafts are copies of "
                         "its target, which a draft of another tokenizer cannot be")
    settings = HostPathSettings(zoo=args.zoo, sessions=tuple(args.sessions), paths=tuple(args.paths),
                                max_tokens=args.max_tokens, k=args.k, min_tokens=args.min_tokens, out=args.out,
                                profile_sessions=args.profile_sessions or None, stream_interval=args.stream_interval,
                                router_replicas=args.router_replicas,
                                service_overrides=dotted_overrides(args.overrides), on_zoo=args.on_zoo, sim=args.sim)
    run(settings, "specserve host-path " + " ".join(
        f"--{name.replace('_', '-')} {','.join(map(str, v)) if isinstance(v, tuple) else v}"
        for name, v in (("zoo", args.zoo), ("sessions", tuple(args.sessions)), ("paths", tuple(args.paths)),
                        ("stream_interval", args.stream_interval), ("router_replicas", args.router_replicas)))
        + (" --on-zoo" if args.on_zoo else "") + (f" --sim {args.sim}" if args.sim else "")
        + "".join(f" --set {item}" for item in args.overrides))
    return 0


if __name__ == "__main__":
    module_main(register, "host-path")
