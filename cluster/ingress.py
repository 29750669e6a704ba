"""The router's Serve deployment: the ingress that assembles the service on a gRPC port of its own.

It finds the registry (the control deployment's, cluster/control.py), loads the tokenizer (the
only model file it needs) and serves the client API (``router/service.py``), the standard health
service and server reflection from one grpc.aio server, and the OpenAI-compatible HTTP API
(``router/openai_api.py``) on that server's event loop.
Health turns SERVING once a target replica and the whole draft pool (so a worker for every draft)
have registered (``router/readiness.py``); requests before then run target-only, route "starting".
With ``router.replicas`` > 1 there are as many processes, each its own router, listening on the same
ports (SO_REUSEPORT).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from specserve.proto.v1 import specserve_pb2
from specserve.router.directory import WorkerDirectory
from specserve.router.openai_api import OpenAIServer
from specserve.router.readiness import Readiness
from specserve.router.service import SERVICE_NAME, SpecServeService
from specserve.router.tasks import TaskResolver
from specserve.router.validation import Limits
from specserve.workers.grpc_host import BackgroundServer, advertised_host
from specserve.workers.loading import load_config
from specserve.workers.logs import log_to_stderr
from specserve.workers.registry import Endpoint, Heartbeat, Registration
from specserve.workers.security import SecuritySettings

from .config import ModelsConfig, ServiceConfig
from .canary import REPORT_SECONDS
from .control import find_registry
from .local import load_task_classifier, open_zoo, zoo_location
from .models import ModelSet, check_medusa, check_tokenizers, head_layers
from .pool import ready_size, served_drafts

log = logging.getLogger("specserve.router")
READY_POLL_SECONDS = 0.5
WAITING_LOG_SECONDS = 10.0  # while starting: how often the log says what the router still waits for
HEALTH_POLL_SECONDS = 1.0  # once ready: how often the router checks that a target replica is registered
HTTP_START_SECONDS = 30.0
REPORT_TIMEOUT_SECONDS = 10.0


class Router:
    def __init__(self, config: dict, models: ModelSet, target_deployment=None, control_deployment=None) -> None:
        # The bound target and control deployments' handles: binding them is what makes Serve
        # deploy them. Per-step traffic never goes through either.
        log_to_stderr()  # this process is Serve's: specserve's lines would be lost
        cfg = ServiceConfig.model_validate(config)
        security = SecuritySettings.from_env()  # tokens and TLS: the environment's, never the Serve config's
        security.log_startup(log)
        self.config = cfg
        self.models = models
        tokenizer = check_tokenizers(models)  # before any worker loads a model
        heads = {name: layers for name, layers in head_layers(models).items() if name not in models.on_replica}
        check_medusa(models)  # heads of another target: one line here, not a replica's traceback
        registration = Registration(cfg.namespace, cfg.router.heartbeat_seconds)
        registry = find_registry(cfg.namespace)
        self.router_id = f"router-{uuid.uuid4().hex[:6]}"
        limits = Limits(tasks=models.tasks, drafts=models.proposers, context_window=_context_window(models.target),
                        segments=frozenset(cfg.router.segments))
        self.directory = WorkerDirectory(registry, registration.ttl, security, cfg.router.prefix_affinity_sessions)
        # A draft of the task table that the pool does not serve is never waited for (no worker will
        # come): its requests run target-only, route "unavailable".
        needed = {name for names in models.tasks.values() for name in names} & set(served_drafts(cfg, models))
        self.readiness = Readiness(frozenset(needed), ready_size(cfg, models))
        self.readiness.check(())  # what it waits for, before anything registered
        self.service = SpecServeService(tokenizer, limits, self.directory, cfg.router, _task_resolver(cfg, models),
                                        priors=models.priors, trees=models.trees, heads=heads, on_verifier=models.on_verifier,
                                        cascades=models.cascades,
                                        router_id=self.router_id,
                                        readiness=self.readiness)
        self.health = health_aio.HealthServicer()
        shared = cfg.router.replicas > 1  # the other router processes listen on the same ports
        self.server = BackgroundServer(self._add_servicers, cfg.router.host, cfg.router.port, name="router-grpc",
                                       credentials=security.api_server_credentials(),
                                       interceptors=security.api_interceptors(), reuse_port=shared)
        self.address = f"{advertised_host()}:{self.server.port}"
        self.serving = False  # what the health service says: set by _set_serving only
        self.http = None
        if cfg.router.http_port is not None:  # on the gRPC server's loop: one loop owns the service's state
            self.http = OpenAIServer(self.service, cfg.router.model_name or model_name(cfg.models), security,
                                     serving=lambda: self.serving)
            port = asyncio.run_coroutine_threadsafe(self.http.start(cfg.router.host, cfg.router.http_port, shared),
                                                    self.server.loop).result(HTTP_START_SECONDS)
            log.info("OpenAI-compatible API on http%s://%s:%d/v1 (model %r)", "s" if security.tls else "",
                     advertised_host(), port, self.http.model)
        self.heartbeat = Heartbeat(registration, lambda: Endpoint("router", self.router_id, self.address))
        self.control = control_deployment
        self._stopping = threading.Event()
        if control_deployment is not None:
            threading.Thread(target=self._report_canaries, name="canary-report", daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._mark_serving_when_ready(), self.server.loop)
        # Requests are answered from here on; until the health service says SERVING, one whose draft
        # no worker serves yet runs target-only (route "starting"). Clients that wait for SERVING
        # (SpecServeClient.wait_ready) get speculation from their first request.
        log.info("%s listening on %s; target-only (NOT_SERVING) until ready, waiting for %s", self.router_id,
                 self.address, self.readiness.waiting_for)

    def _report_canaries(self) -> None:
        """Every REPORT_SECONDS: this router's canary arms to the control deployment, and every
        canary's state back into the router (what it routes by). A Serve call waits: a thread of its own."""
        failing = False
        while not self._stopping.wait(REPORT_SECONDS):
            try:
                counts = asyncio.run_coroutine_threadsafe(_read(self.service.canaries.counts), self.server.loop).result(
                    REPORT_TIMEOUT_SECONDS)
                statuses = self.control.canary_report.remote(self.router_id, counts).result(
                    timeout_s=REPORT_TIMEOUT_SECONDS)
            except Exception as exc:  # the control replica restarting: canaries stay as last read
                if not failing:
                    log.warning("canaries: the control deployment did not answer (%s); routing by the canaries as "
                                "last read", exc)
                failing = True
                continue
            if failing:
                log.info("canaries: the control deployment answers again")
            failing = False
            self.server.loop.call_soon_threadsafe(self.service.canaries.update, statuses)

    def _add_servicers(self, server) -> None:
        server.add_generic_rpc_handlers((self.service.handler(),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        names = (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, server, pool=specserve_pb2.DESCRIPTOR.pool)

    async def _mark_serving_when_ready(self) -> None:
        """NOT_SERVING until the configured capacity is up (router/readiness.py), saying every
        WAITING_LOG_SECONDS what is missing. Then NOT_SERVING again whenever no target replica is
        registered (every request would wait for one, then fail), and SERVING when one returns; a
        missing draft worker only slows requests (they run on another worker, or target-only)."""
        await self._set_serving(False, f"starting: waiting for {self.readiness.waiting_for}")
        said = time.monotonic()
        while True:
            try:
                endpoints = await self.directory.refresh(force=True)
            except Exception as exc:  # the registry itself unreachable: say so, keep waiting
                log.warning("health: the registry did not answer (%s)", exc)
                endpoints = None
            if endpoints is not None and self.readiness.check(endpoints):
                break
            if time.monotonic() - said >= WAITING_LOG_SECONDS:
                log.info("not serving yet: waiting for %s", self.readiness.waiting_for)
                said = time.monotonic()
            await asyncio.sleep(READY_POLL_SECONDS)
        await self._set_serving(True, f"ready, speculation on: {self.readiness.describe(endpoints)}")
        while True:
            await asyncio.sleep(HEALTH_POLL_SECONDS)
            try:
                endpoints = await self.directory.refresh(force=True)
            except Exception as exc:  # the registry itself unreachable: say so, keep watching
                log.warning("health: the registry did not answer (%s)", exc)
                continue
            self.readiness.check([e for e in endpoints if e.kind != "target" or self._reachable(e)])
            if bool(self.readiness.targets) != self.serving:
                await self._set_serving(bool(self.readiness.targets),
                                        f"{self.readiness.targets} target replicas registered")

    def _reachable(self, endpoint) -> bool:
        """A registered target replica whose process is not gone: its entry outlives it by up to the
        registry's ttl, but its channel fails at once (connection refused), so health says NOT_SERVING
        from the next poll, not a ttl later, and whatever replaces it within that ttl (Serve
        restarting it) cannot hide the gap."""
        state = self.directory.channel(endpoint).get_state(try_to_connect=True)
        return state not in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN)

    async def _set_serving(self, serving: bool, why: str) -> None:
        self.serving = serving
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", SERVICE_NAME):
            await self.health.set(service, status)
        log.log(logging.INFO if serving else logging.WARNING, "health: %s (%s)",
                "SERVING" if serving else "NOT_SERVING", why)

    def endpoint(self) -> str:
        return self.address

    def http_endpoint(self) -> str | None:
        """host:port of the OpenAI-compatible API; None when router.http_port turns it off."""
        return f"{advertised_host()}:{self.http.port}" if self.http else None

    def check_health(self) -> None:
        if not self.server.alive:
            raise RuntimeError("the router's gRPC server stopped")

    def __del__(self) -> None:
        sample = getattr(getattr(self, "service", None), "sample", None)
        if sample is not None:  # what it kept since its last flush
            sample.stop()
        if (stopping := getattr(self, "_stopping", None)) is not None:
            stopping.set()
        for part in ("heartbeat", "server"):
            obj = getattr(self, part, None)
            if obj is not None:
                obj.stop()


async def _read(call):
    return call()


def _task_resolver(cfg: ServiceConfig, models: ModelSet) -> TaskResolver:
    policy = cfg.router.policy
    zoo = open_zoo(cfg.models.zoo) if cfg.models.zoo is not None else None
    classifier = load_task_classifier(policy.classifier, zoo)
    if classifier is None:
        log.info("no task classifier: requests without a task are served as %r", cfg.router.default_task)
    return TaskResolver(frozenset(models.tasks), cfg.router.default_task, classifier, policy.classifier_min_confidence)


def model_name(models: ModelsConfig) -> str:
    """What the OpenAI API calls the target: a zoo's by the zoo (``zoo-demo``), a hub id as given,
    a directory or GGUF file by its name."""
    if models.target is None:
        return f"zoo-{zoo_location(models.zoo).resolve().name}"
    path = Path(models.target)
    if not path.exists():
        return models.target
    return path.stem if path.suffix == ".gguf" else path.resolve().name


def _context_window(target_source: str) -> int:
    return int(load_config(target_source).max_position_embeddings)
