"""What one router process sustains, measured where it is the bottleneck: the router alone, on its
own core, in front of a stand-in target replica that costs next to nothing.

`specserve host-path` reads the router's CPU per token while the real replica (a model on this
CPU) sets the pace, so its router never falls behind and every token is its own round. Here the
replica is a stand-in process (the real multiplexed wire, ``VerifyMany``, with the real worker side,
``serve_multiplexed``) that runs a "pass" every ``--pass-ms`` milliseconds: each session with tokens
granted gets one token a pass, all of a pass's replies in one message, as a replica answers a decode
run (in groups, as a replica sends them, when the router's stream interval asks for them). The
router is the real one (``SpecServeService`` on a ``BackgroundServer``), its registry a fixed table
naming the stand-in. Clients (this process, on the other core) stream target-only
requests (speculation OFF) back to back at each level of concurrent sessions.

It prints per level: tokens/s, the router's CPU microseconds per token (user + system), the
tokens per client chunk (above 1: the router found a decode run's tokens waiting and sent them in
one write), and 1e6 / (router us per token), the tokens/s a saturated router core gives at that cost.

    python -m specserve.bench.experiments.router_ceiling [--sessions 1,16,64,256] [--pass-ms 1] [--stream-interval 1]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import multiprocessing
import os
import time
from pathlib import Path

import grpc

from .stream_floor import cpu_seconds

TOKEN = 65  # what the stand-in replica decodes: a plain token, never EOS


def stand_in_replica(port: multiprocessing.Value, ready, pass_ms: float, core: int | None) -> None:
    """A target replica that computes nothing: a pass every ``pass_ms``, one token per granted session."""
    from specserve.proto.v1 import internal_pb2 as pb
    from specserve.proto.v1 import internal_pb2_grpc as rpc
    from specserve.workers.multiplexing import serve_multiplexed

    if core is not None:
        os.sched_setaffinity(0, {core})
    sessions: dict[asyncio.Queue, Run] = {}  # each open session's queue: its run

    async def session(requests, context):
        queue: asyncio.Queue = asyncio.Queue()
        run = sessions[queue] = Run()

        async def read() -> None:
            async for request in requests:
                if request.WhichOneof("kind") == "open":
                    run.group = max(1, request.open.target.decode_group)
                run.owed += request.decode
            sessions.pop(queue, None)
            queue.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (reply := await queue.get()) is not None:
                yield reply
        finally:
            reader.cancel()
            sessions.pop(queue, None)

    async def passes() -> None:
        while True:
            await asyncio.sleep(pass_ms / 1000)
            decoding = [(q, run) for q, run in sessions.items() if run.owed > 0]
            info = pb.PassInfo(tokens=len(decoding), sessions=len(decoding))
            for queue, run in decoding:
                run.owed -= 1
                run.drawn += 1
                run.held.append(pb.VerifyReply(verdict=pb.Verdict(token=TOKEN), seconds=pass_ms / 1000,
                                               pass_info=info))
                if run.drawn == 1 or len(run.held) >= run.group or run.owed == 0:  # as DecodeRuns groups
                    for reply in run.held:
                        queue.put_nowait(reply)
                    run.held.clear()

    class Replica(rpc.VerifierServicer):
        async def VerifyMany(self, frames, context):
            async for message in serve_multiplexed(frames, session, pb.VerifyRequest.FromString):
                yield message

    async def main() -> None:
        server = grpc.aio.server()
        rpc.add_VerifierServicer_to_server(Replica(), server)
        port.value = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        asyncio.ensure_future(passes())
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


class Run:
    """A stand-in session's decode run: tokens granted and not drawn, drawn, held for a group."""

    def __init__(self) -> None:
        self.owed = self.drawn = 0
        self.group = 1
        self.held: list = []


class FixedRegistry:
    """The registry's one call the router makes (``endpoints.remote().future()``), from a fixed table."""

    def __init__(self, table: list) -> None:
        self.table = table
        self.endpoints = self

    def remote(self):
        return self

    def future(self) -> concurrent.futures.Future:
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(self.table)
        return done


def router(port: multiprocessing.Value, ready, zoo: str, replica: str, core: int | None, sessions: int,
           interval: int) -> None:
    """The real router's service, as the router deployment assembles it, target-only."""
    from transformers import AutoTokenizer

    from specserve.router.config import RouterConfig
    from specserve.router.directory import WorkerDirectory
    from specserve.router.service import SpecServeService
    from specserve.router.tasks import TaskResolver
    from specserve.router.validation import Limits
    from specserve.workers.grpc_host import BackgroundServer
    from specserve.workers.registry import Endpoint

    if core is not None:
        os.sched_setaffinity(0, {core})
    tokenizer = AutoTokenizer.from_pretrained(Path(zoo) / "tokenizer")
    tasks = {"general": ("ngram",)}  # a proposer the policy prices (the requests are OFF: never used)
    registry = FixedRegistry([Endpoint("target", "stand-in", replica, ("target",), pass_sessions=sessions)])
    config = RouterConfig(tasks=tasks, default_task="general", max_concurrent_requests=sessions,
                          max_queued_requests=sessions, http_port=None, stream_interval_tokens=interval)
    service = SpecServeService(tokenizer, Limits(tasks, ("ngram",), 1 << 16), WorkerDirectory(registry, 10.0), config,
                               TaskResolver(frozenset(tasks), "general", None, 0.5))
    server = BackgroundServer(lambda s: s.add_generic_rpc_handlers((service.handler(),)), "127.0.0.1", 0,
                              name="router-grpc")
    port.value = server.port
    ready.set()
    while True:
        time.sleep(3600)


async def clients(address: str, streams: int, requests: int, max_tokens: int) -> tuple[int, int]:
    """(tokens, chunks) of ``streams`` clients each streaming ``requests`` target-only requests."""
    from specserve.proto.v1 import specserve_pb2 as pb
    from specserve.proto.v1 import specserve_pb2_grpc as rpc

    request = pb.GenerateRequest(prompt="def fib(n):", max_tokens=max_tokens, temperature=0.0,
                                 speculation=pb.SPECULATION_OFF)
    tokens = chunks = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = rpc.SpecServeStub(channel)

        async def one() -> None:
            nonlocal tokens, chunks
            for _ in range(requests):
                async for chunk in stub.GenerateStream(request):
                    tokens += len(chunk.token_ids)
                    chunks += 1

        await asyncio.gather(*(one() for _ in range(streams)))
    return tokens, chunks


def start(target, *args) -> tuple[multiprocessing.Process, int]:
    port, ready = multiprocessing.Value("i", 0), multiprocessing.Event()
    process = multiprocessing.Process(target=target, args=(port, ready, *args), daemon=True)
    process.start()
    if not ready.wait(120):
        raise RuntimeError(f"{target.__name__} did not start")
    return process, port.value


def main(argv: list[str] | None = None) -> None:
    from specserve.cluster.local import zoo_location

    parser = argparse.ArgumentParser(prog="python -m specserve.bench.experiments.router_ceiling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", default="1,16,64,256", help="concurrent client streams per level")
    parser.add_argument("--pass-ms", type=float, default=1.0, help="the stand-in replica's pass time")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--min-tokens", type=int, default=8192, help="tokens per level, at least")
    parser.add_argument("--zoo", default="demo", help="whose tokenizer the router detokenizes with")
    parser.add_argument("--stream-interval", type=int, default=1, help="router.stream_interval_tokens")
    args = parser.parse_args(argv)
    levels = [int(s) for s in args.sessions.split(",")]
    cores = sorted(os.sched_getaffinity(0))
    router_core = cores[-1] if len(cores) > 1 else None
    replica, replica_port = start(stand_in_replica, args.pass_ms, cores[0] if len(cores) > 1 else None)
    served, port = start(router, str(zoo_location(args.zoo)), f"127.0.0.1:{replica_port}", router_core, max(levels),
                       args.stream_interval)
    if len(cores) > 1:
        os.sched_setaffinity(0, set(cores[:-1]))  # the clients beside the stand-in, off the router's core
    address = f"127.0.0.1:{port}"
    print(f"router alone on core {router_core}; stand-in replica, a pass every {args.pass_ms:g} ms; "
          f"{args.max_tokens} tokens a request, target-only; stream interval {args.stream_interval}")
    print("| sessions | tokens/s | router us/token | tokens/chunk | 1e6 / router us a token |")
    print("|---|---|---|---|---|")
    try:
        asyncio.run(clients(address, 2, 1, args.max_tokens))  # warm: streams opened, first requests
        for sessions in levels:
            per_session = max(2, -(-args.min_tokens // (sessions * args.max_tokens)))
            before, begun = cpu_seconds(served.pid), time.perf_counter()
            tokens, chunks = asyncio.run(clients(address, sessions, per_session, args.max_tokens))
            seconds, cpu = time.perf_counter() - begun, cpu_seconds(served.pid) - before
            us = 1e6 * cpu / tokens
            ceiling = f"{1e6 / us:,.0f}" if us else "-"  # no CPU tick counted: too few tokens to tell
            print(f"| {sessions} | {tokens / seconds:,.0f} | {us:,.0f} | {tokens / chunks:.2f} | {ceiling} |", flush=True)
    finally:
        served.kill()
        replica.kill()


if __name__ == "__main__":
    main()
