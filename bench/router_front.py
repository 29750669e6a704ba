"""Client-observed gRPC latency of two ways of fronting a Ray Serve deployment, side by side:

  A  Serve's own gRPC proxy (serve.start(grpc_options=...)), the replica's methods named as the RPCs;
  B  a grpc.aio server the replica starts itself on its own port (workers.grpc_host.BackgroundServer).

Neither does any work: Generate returns "x" and 8 token ids, GenerateStream yields 32 one-token chunks.
A sync client in the driver alternates A and B calls and prints unary round-trip latency (median, p90)
and streaming latency (first chunk, whole stream, per chunk; medians), with the ratio B/A.

    .venv/bin/python bench/router_front.py [--calls 300] [--streams 50]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time

import grpc
import ray
from ray import serve
from ray.serve.config import gRPCOptions

APP = "bench"
CHUNKS = 32
WARMUP = 30


def make_servicer():
    """The trivial SpecServe servicer of front B (imports inside: module-level _pb2 imports have broken pickling)."""
    from specserve.proto.v1 import specserve_pb2 as pb, specserve_pb2_grpc as rpc

    class Servicer(rpc.SpecServeServicer):
        async def Generate(self, request, context):
            return pb.GenerateResponse(text="x", token_ids=list(range(8)))

        async def GenerateStream(self, request, context):
            for i in range(CHUNKS):
                yield pb.GenerateChunk(text="x", token_ids=[i])

    return Servicer()


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Front:
    def __init__(self) -> None:
        from specserve.proto.v1 import specserve_pb2_grpc as rpc
        from specserve.workers.grpc_host import BackgroundServer

        servicer = make_servicer()
        self.server = BackgroundServer(lambda server: rpc.add_SpecServeServicer_to_server(servicer, server),
                                       "127.0.0.1", 0, name="bench-grpc")

    def port(self) -> int:
        return self.server.port

    async def Generate(self, request):  # front A: Serve's proxy calls the method named like the RPC
        from specserve.proto.v1 import specserve_pb2 as pb
        return pb.GenerateResponse(text="x", token_ids=list(range(8)))

    async def GenerateStream(self, request):
        from specserve.proto.v1 import specserve_pb2 as pb
        for i in range(CHUNKS):
            yield pb.GenerateChunk(text="x", token_ids=[i])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unary(stub, metadata) -> float:
    start = time.perf_counter()
    stub.Generate(request(), metadata=metadata)
    return time.perf_counter() - start


def stream(stub, metadata) -> tuple[float, float]:
    """(seconds to the first chunk, seconds for the whole stream)."""
    start = time.perf_counter()
    first, count = 0.0, 0
    for count, _ in enumerate(stub.GenerateStream(request(), metadata=metadata), 1):
        first = first or time.perf_counter() - start
    total = time.perf_counter() - start
    if count != CHUNKS:
        raise RuntimeError(f"stream gave {count} chunks, expected {CHUNKS}")
    return first, total


def request():
    from specserve.proto.v1 import specserve_pb2 as pb
    return pb.GenerateRequest(prompt="hello", max_tokens=CHUNKS)


def main() -> None:
    args = parse_args(__doc__)
    from specserve.proto.v1 import specserve_pb2_grpc as rpc

    ray.init(include_dashboard=False, log_to_driver=False, object_store_memory=100 * 1024 * 1024)
    try:
        proxy_port = free_port()
        serve.start(http_options={"port": free_port()},
                    grpc_options=gRPCOptions(port=proxy_port, grpc_servicer_functions=[
                        "specserve.proto.v1.specserve_pb2_grpc.add_SpecServeServicer_to_server"]))
        handle = serve.run(Front.bind(), name=APP, route_prefix=f"/{APP}")  # None: the proxy won't route it
        own_port = handle.port.remote().result()
        fronts = {  # name -> (stub, metadata)
            "A serve proxy": (rpc.SpecServeStub(grpc.insecure_channel(f"127.0.0.1:{proxy_port}")),
                              (("application", APP),)),
            "B own server": (rpc.SpecServeStub(grpc.insecure_channel(f"127.0.0.1:{own_port}")), ()),
        }
        results = alternate(fronts, lambda front: unary(*front), lambda front: stream(*front), args)
        report(results, args)
    finally:
        serve.shutdown()
        ray.shutdown()


def parse_args(doc: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="measured unary calls per front")
    parser.add_argument("--streams", type=int, default=50, help="measured streams per front")
    return parser.parse_args()


def alternate(fronts: dict, call, call_stream, args) -> dict:
    """Each front's unary latencies, and (first chunk, whole stream) latencies, A and B taking
    turns so noise hits both; warm-up calls left out. ``call(front)`` -> seconds;
    ``call_stream(front)`` -> (seconds to the first chunk, seconds in all)."""
    results = {name: {"unary": [], "first": [], "stream": []} for name in fronts}
    for i in range(WARMUP + args.calls):
        for name, front in fronts.items():
            seconds = call(front)
            if i >= WARMUP:
                results[name]["unary"].append(seconds)
    for i in range(5 + args.streams):
        for name, front in fronts.items():
            first, total = call_stream(front)
            if i >= 5:
                results[name]["first"].append(first)
                results[name]["stream"].append(total)
    return results


def report(results: dict, args) -> None:
    def row(r):
        ms = lambda xs, q=0.5: statistics.quantiles(xs, n=100)[int(q * 100) - 1] * 1e3
        return [ms(r["unary"]), ms(r["unary"], 0.9), ms(r["first"]), ms(r["stream"]),
                ms(r["stream"]) / CHUNKS]
    cols = ["unary p50", "unary p90", "stream 1st p50", f"stream {CHUNKS} p50", "per chunk"]
    a, b = (row(r) for r in results.values())
    print(f"{args.calls} unary calls and {args.streams} streams per front, alternating; milliseconds")
    print(f"{'':>14}" + "".join(f"{c:>16}" for c in cols))
    for name, vals in zip(results, (a, b)):
        print(f"{name:>14}" + "".join(f"{v:>16.3f}" for v in vals))
    print(f"{'ratio B/A':>14}" + "".join(f"{y / x:>16.2f}" for x, y in zip(a, b)))


if __name__ == "__main__":
    main()
