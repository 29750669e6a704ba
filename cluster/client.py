"""A small client of the SpecServe API, for the command line, the demo and the tests."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specserve.proto.v1 import specserve_pb2 as pb
from specserve.proto.v1 import specserve_pb2_grpc as rpc

FINISH_NAMES = {pb.FINISH_REASON_EOS: "eos", pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length",
                pb.FINISH_REASON_UNSPECIFIED: ""}


class SpecServeClient:
    def __init__(self, address: str) -> None:
        self.address = address
        self.channel = grpc.insecure_channel(address)
        self.stub = rpc.SpecServeStub(self.channel)

    def generate(self, request: pb.GenerateRequest, timeout: float | None = None) -> pb.GenerateResponse:
        return self.stub.Generate(request, timeout=timeout)

    def stream(self, request: pb.GenerateRequest, timeout: float | None = None) -> Iterator[pb.GenerateChunk]:
        return self.stub.GenerateStream(request, timeout=timeout)

    def stats(self, timeout: float | None = 10.0) -> pb.ServiceStats:
        return self.stub.GetStats(pb.GetStatsRequest(), timeout=timeout)

    def health(self, timeout: float = 5.0) -> int:
        check = health_pb2_grpc.HealthStub(self.channel).Check
        return check(health_pb2.HealthCheckRequest(service=""), timeout=timeout).status

    def wait_ready(self, timeout: float) -> None:
        """Poll the health service until SERVING; TimeoutError names the last state seen."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                status = self.health()
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
            except grpc.RpcError as exc:
                last = exc.code().name
            time.sleep(0.5)
        raise TimeoutError(f"specserve at {self.address} not SERVING after {timeout:.0f} s (last: {last})")

    def close(self) -> None:
        self.channel.close()
