"""A small client of the SpecServe API, for the command line, the demo and the tests.

Security comes from the environment, as the service's does (workers/security.py): the API token from
SPECSERVE_API_TOKEN(_FILE) goes with every call, and with SPECSERVE_TLS_DIR set the channel is TLS,
verifying the router against that directory's ca.crt (the only file a client needs there).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specserve.proto.v1 import specserve_pb2 as pb
from specserve.proto.v1 import specserve_pb2_grpc as rpc

from specserve.workers.security import TARGET_NAME_OVERRIDE, BearerToken, SecuritySettings
from specserve.workers.stats import SpecStats

READY_TIMEOUT_SECONDS = 600.0  # model loading on a cold machine; a GPU node pulling weights takes longer
WAITING_ASK_SECONDS = 5.0  # while a service starts: how often wait_ready asks what it waits for
FINISH_NAMES = {pb.FINISH_REASON_EOS: "eos", pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length",
                pb.FINISH_REASON_GRAMMAR: "grammar", pb.FINISH_REASON_UNSPECIFIED: ""}


class SpecServeClient:
    """``token`` and ``root_certificates`` (PEM) default to the environment's; ``server_name`` is the
    name to verify the router's certificate under when it differs from ``address``'s host."""

    def __init__(self, address: str, token: str | None = None, root_certificates: bytes | None = None,
                 server_name: str | None = None) -> None:
        self.address = address
        env = SecuritySettings.from_env()
        token = token or env.api_token
        root_certificates = root_certificates or (env.tls.ca if env.tls else None)
        if root_certificates:
            options = [(TARGET_NAME_OVERRIDE, server_name)] if server_name else []
            channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates), options=options)
        else:
            channel = grpc.insecure_channel(address)
        self.channel = grpc.intercept_channel(channel, BearerToken(token)) if token else channel
        self.stub = rpc.SpecServeStub(self.channel)

    def generate(self, request: pb.GenerateRequest, timeout: float | None = None) -> pb.GenerateResponse:
        return self.stub.Generate(request, timeout=timeout)

    def stream(self, request: pb.GenerateRequest, timeout: float | None = None) -> Iterator[pb.GenerateChunk]:
        return self.stub.GenerateStream(request, timeout=timeout)

    def stats(self, timeout: float | None = 10.0) -> pb.ServiceStats:
        return self.stub.GetStats(pb.GetStatsRequest(), timeout=timeout)

    def health(self, timeout: float = 5.0, service: str = "") -> int:
        """The standard health check ("": the whole server); needs no token."""
        check = health_pb2_grpc.HealthStub(self.channel).Check
        return check(health_pb2.HealthCheckRequest(service=service), timeout=timeout).status

    def wait_ready(self, timeout: float, say: Callable[[str], None] | None = None) -> None:
        """Poll the health service until SERVING (the configured capacity is up: speculation on);
        ``say`` hears what the service still waits for (GetStats' waiting_for) whenever it changes.
        TimeoutError names the last state seen."""
        deadline = time.monotonic() + timeout
        last, said, asked = "no answer", "", 0.0
        while time.monotonic() < deadline:
            try:
                status = self.health()
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
            except grpc.RpcError as exc:  # the details name a TLS problem (an address the certificate lacks)
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:  # a front without the health service: go on
                    return
                last = f"{exc.code().name}: {exc.details()}"
            else:  # what it waits for, now and then: GetStats is work for a router that is starting
                if say is not None and time.monotonic() - asked >= WAITING_ASK_SECONDS:
                    said, asked = self._say_waiting(say, said), time.monotonic()
            time.sleep(0.5)
        raise TimeoutError(f"specserve at {self.address} not SERVING after {timeout:.0f} s (last: {last})")

    def _say_waiting(self, say: Callable[[str], None], said: str) -> str:
        """Tell ``say`` what the service waits for, when that changed (GetStats, which needs the
        token the health check does not: a refusal is left to the request that follows)."""
        try:
            waiting = self.stats().waiting_for
        except grpc.RpcError:
            return said
        if waiting and waiting != said:
            say(f"specserve at {self.address} is starting; waiting for {waiting}")
        return waiting or said

    def close(self) -> None:
        self.channel.close()


def stats_from_message(msg: pb.GenerateStats) -> SpecStats:
    """A response's statistics as the in-process engine keeps them."""
    return SpecStats(proposed=msg.proposed_tokens, accepted=msg.accepted_tokens, target_passes=msg.target_passes,
                     rejections=msg.rejections, drafted=msg.drafted_tokens, wasted=msg.wasted_draft_tokens,
                     draft_seconds=msg.draft_seconds, verify_seconds=msg.verify_seconds,
                     lookaheads=msg.lookaheads, lookahead_hits=msg.lookahead_hits, seed=msg.seed,
                     branch_hits=msg.branch_hits)
