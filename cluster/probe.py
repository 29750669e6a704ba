"""The router pod's readiness probe when the client API serves TLS: exit 0 when SERVING.

    python -m specserve.cluster.probe HOST:PORT [SERVICE]

Kubernetes' native gRPC probe speaks plaintext only, so with SPECSERVE_TLS_DIR set the RayService
runs this instead: the standard health check (no token needed) over TLS. It dials the router on
this pod and verifies its certificate under the internal name (SPECSERVE_TLS_SERVER_NAME, default
specserve-internal), which every specserve certificate carries, so the certificate needs no SAN for
localhost. Imports no model code (nor the config, which imports torch): it runs every few seconds.
"""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2

from .client import SpecServeClient
from specserve.workers.security import SecuritySettings

TIMEOUT_SECONDS = 3.0  # below the manifest's timeoutSeconds, so a slow answer is a failure, not a kill


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2:
        print("usage: python -m specserve.cluster.probe HOST:PORT [SERVICE]", file=sys.stderr)
        return 2
    address, service = args[0], (args[1] if len(args) == 2 else "")
    client = SpecServeClient(address, server_name=SecuritySettings.from_env().server_name)
    try:
        status = client.health(TIMEOUT_SECONDS, service)
    except grpc.RpcError as exc:
        print(f"{address}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if status != health_pb2.HealthCheckResponse.SERVING:
        print(f"{address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
