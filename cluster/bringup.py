"""Bringing the service up: an embedded local Ray cluster (or an existing one), the Serve app from
the config file, and a wait until the router's health service says SERVING."""

from __future__ import annotations

import copy
import logging
import pkgutil
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import ray
from ray import serve

from .client import READY_TIMEOUT_SECONDS, SpecServeClient
from .config import DEFAULT_CONFIG_FILE, NAMESPACE, ServiceConfig, load_yaml
from .models import check_medusa, check_tokenizers, head_layers, resolve_models
from .placement import check_devices, embedded_resources, local_resources
from specserve.workers.security import SecuritySettings

log = logging.getLogger("specserve.cluster")
# Small for an embedded cluster: the service moves tokens over gRPC, not objects through the store.
LOCAL_OBJECT_STORE_BYTES = 256 * 1024 * 1024
# Ray's default is 10 s; an embedded cluster is watched by a person or a test, so report sooner.
LOCAL_METRICS_REPORT_MS = 2000


def default_config_path() -> Path:
    """deploy/serve_config.yaml of the source checkout this package runs from."""
    if not DEFAULT_CONFIG_FILE.exists():
        raise ValueError(f"no --config given and {DEFAULT_CONFIG_FILE} does not exist (specserve is installed "
                         f"without its source tree): pass --config FILE")
    return DEFAULT_CONFIG_FILE


@dataclass
class RunningService:
    address: str  # host:port of the client API
    app_name: str
    owns_cluster: bool
    http_address: str | None = None  # host:port of the OpenAI-compatible API; None: turned off

    def stop(self) -> None:
        """Delete the app (its replicas, the routers, the registry and the draft pool); stop an embedded cluster."""
        if self.owns_cluster:
            ray.shutdown()  # takes Serve, the app and the pool with it
        else:
            serve.delete(self.app_name)
        log.info("specserve stopped")


def serve_config(path: Path, port: int | None = None, overrides: dict | None = None) -> dict:
    """The config file's document, with the router port and any ``args`` overrides applied."""
    doc = load_yaml(path)
    apps = doc.get("applications") or []
    if len(apps) != 1:
        raise ValueError(f"{path}: expected exactly one application, found {len(apps)}")
    args = apps[0].setdefault("args", {})
    merge_into(args, overrides or {})
    if port is not None:
        router = args.setdefault("router", {})
        router["port"] = port
        # Port 0 (any free port: tests, benchmarks, the demo) means both APIs, unless the
        # overrides place the HTTP one or the config turns it off.
        named = "http_port" in (overrides or {}).get("router", {})
        if port == 0 and not named and router.get("http_port", 0) is not None:
            router["http_port"] = 0
    return doc


def pin_shared_ports(args: dict) -> None:
    """Several router processes (router.replicas) share their ports, so "any free port" (0) must be
    one port for all: pick it here, before they start. (Another program could take it in between;
    the routers would then fail to start, saying so.)"""
    router = args.get("router") or {}
    if router.get("replicas", 1) <= 1:
        return
    for key in ("port", "http_port"):
        if router.get(key) == 0:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((router.get("host", "0.0.0.0"), 0))
                router[key] = probe.getsockname()[1]


def check_ports_free(host: str, ports: dict[str, int | None]) -> None:
    """Refuse in one line, before anything is deployed, a port something else listens on (deploying
    would take ~20 s and then fail deep inside Serve without naming it)."""
    for what, port in ports.items():
        if not port:  # None: off; 0: any free port
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed socket's TIME_WAIT is no user
            try:
                probe.bind((host, port))
            except OSError as exc:
                raise ValueError(f"port {port} is in use ({what}: {exc.strerror}); pick another, or stop what "
                                 f"listens there") from None


def merge_into(base: dict, overrides: dict) -> None:
    """Overrides win key by key, at any depth: {"router": {"policy": {"k_max": 16}}} changes one field."""
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge_into(base[key], value)
        else:
            base[key] = value


def start_cluster(address: str | None, metrics_port: int | None = None, resources: dict | None = None) -> bool:
    """Attach to ``address``, or start an embedded cluster exporting Prometheus metrics at
    ``metrics_port`` (None: a port Ray picks; an existing cluster has its own) with ``resources``
    (None: ``local_resources()``). True when this process owns the cluster."""
    if ray.is_initialized():
        return False
    previous = signal.getsignal(signal.SIGTERM)
    if address:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    else:
        ray.init(namespace=NAMESPACE, resources=resources or local_resources(), include_dashboard=False,
                 log_to_driver=False,
                 object_store_memory=LOCAL_OBJECT_STORE_BYTES, _metrics_export_port=metrics_port,
                 _system_config={"metrics_report_interval_ms": LOCAL_METRICS_REPORT_MS})
    if callable(previous):  # ray.init installs a SIGTERM handler that aborts; keep the caller's clean stop
        signal.signal(signal.SIGTERM, previous)
    return not address


def embedded_node(resources: dict | None = None) -> dict:
    """The node the embedded cluster will be, as ``ray.nodes()`` lists it: its custom resources
    (None: ``local_resources()``), and the GPUs Ray will find (those torch sees)."""
    import torch

    return {"Alive": True, "Resources": (resources or local_resources()) | {"GPU": float(torch.cuda.device_count())}}


def start_service(config_path: Path | None = None, address: str | None = None, port: int | None = None,
                  overrides: dict | None = None, ready_timeout: float = READY_TIMEOUT_SECONDS,
                  metrics_port: int | None = None) -> RunningService:
    doc = serve_config(config_path or default_config_path(), port, overrides)
    pin_shared_ports(doc["applications"][0]["args"])
    security = SecuritySettings.from_env()  # a bad variable fails here, before any cluster starts
    resources = None
    if not address and not ray.is_initialized():  # everything runs on this machine: check it here, in one line
        config = ServiceConfig.model_validate(doc["applications"][0]["args"])
        resources = embedded_resources(config)
        check_ports_free(config.router.host, {"--port (router.port, the gRPC API)": config.router.port,
                                              "--http-port (router.http_port, the OpenAI API)": config.router.http_port,
                                              "--metrics-port": metrics_port})
        # Models that are no models, or drafts of another vocabulary, fail here in seconds rather
        # than in the router's process after a deploy (a traceback from Serve ~20 s later).
        models = resolve_models(config.models, config.router)
        check_tokenizers(models)
        head_layers(models)  # an EAGLE-3 head for another target, too
        check_medusa(models)  # and Medusa heads
        check_devices(config, [embedded_node(resources)], embedded=True)  # the real nodes are checked again below
    owns = start_cluster(address, metrics_port, resources)
    if owns:  # an embedded cluster's processes inherit this environment (the router warns if it is open)
        log.info("security: %s", security.describe())
    app_doc = doc["applications"][0]
    try:
        check_devices(ServiceConfig.model_validate(app_doc["args"]), ray.nodes())
        serve.start(proxy_location=doc.get("proxy_location", "Disabled"))
        app = pkgutil.resolve_name(app_doc["import_path"])(copy.deepcopy(app_doc["args"]))
        handle = serve.run(app, name=app_doc["name"], route_prefix=app_doc.get("route_prefix"))
        address = handle.endpoint.remote().result()
        http_address = handle.http_endpoint.remote().result()
        SpecServeClient(address).wait_ready(ready_timeout, say=log.info)
    except BaseException:
        if owns:
            ray.shutdown()
        raise
    log.info("specserve serving at %s (OpenAI API: %s)", address, http_address or "off")
    return RunningService(address, app_doc["name"], owns, http_address)


def sigterm_as_interrupt() -> None:
    """Let SIGTERM (Kubernetes, systemd, kill) stop us as Ctrl-C does, with the same clean-up."""

    def _interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)


def wait_forever() -> None:
    while True:
        time.sleep(3600)
