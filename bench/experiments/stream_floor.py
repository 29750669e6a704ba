"""What one message on a client's stream costs a grpc.aio server in Python here: the floor under the
router's CPU per token while it writes one chunk a token.

A server process (its own core, like the router) serves ``GenerateStream`` to S concurrent clients
(S = 1, 16, 64), each stream N one-token chunks, three ways:

    yield       the handler yields its chunks back to back: a write per chunk and nothing else
    woken       each chunk waits for a queue the way the router's request waits for its verdict
                (one task wake a chunk, fed by a producer that puts one item per stream per turn,
                as a multiplexed stream delivers a pass's verdicts)
    woken x4    the same, four tokens a chunk (what a router behind its replica finds waiting)

It prints the server's CPU microseconds per message and per token (user + system of the server
process over the run) and messages per second. Nothing else runs in the server: no
model, no bookkeeping, no detokenizing.

    python -m specserve.bench.experiments.stream_floor [--streams 1,16,64] [--chunks 256]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import time

import grpc
import psutil

MODES = {"yield": 1, "woken": 1, "woken x4": 4}  # mode: tokens a chunk


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (psutil, as the host-path bench reads them)."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def serve(port: multiprocessing.Value, ready, core: int | None) -> None:
    from specserve.proto.v1 import specserve_pb2 as pb
    from specserve.proto.v1 import specserve_pb2_grpc as rpc

    if core is not None:
        os.sched_setaffinity(0, {core})

    class Servicer(rpc.SpecServeServicer):
        def __init__(self) -> None:
            self.waiting: list[asyncio.Queue] = []
            self.feeder: asyncio.Task | None = None

        async def GenerateStream(self, request, context):
            mode, chunks = request.task, request.max_tokens
            per = MODES[mode]
            if mode == "yield":
                for i in range(chunks):
                    yield pb.GenerateChunk(text="ab" * per, token_ids=[i] * per)
                return
            queue: asyncio.Queue = asyncio.Queue()
            self.waiting.append(queue)
            if self.feeder is None or self.feeder.done():
                self.feeder = asyncio.ensure_future(self.feed())
            try:
                for i in range(chunks):
                    await queue.get()
                    yield pb.GenerateChunk(text="ab" * per, token_ids=[i] * per)
            finally:
                self.waiting.remove(queue)

        async def feed(self) -> None:
            """One item per open stream a turn: a pass's verdicts, delivered."""
            while self.waiting:
                for queue in self.waiting:
                    if queue.qsize() < 2:
                        queue.put_nowait(None)
                await asyncio.sleep(0)

    async def main() -> None:
        server = grpc.aio.server()
        rpc.add_SpecServeServicer_to_server(Servicer(), server)
        port.value = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


async def clients(address: str, streams: int, chunks: int, mode: str) -> int:
    from specserve.proto.v1 import specserve_pb2 as pb
    from specserve.proto.v1 import specserve_pb2_grpc as rpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = rpc.SpecServeStub(channel)

        async def one() -> int:
            return sum([1 async for _ in stub.GenerateStream(pb.GenerateRequest(task=mode, max_tokens=chunks))])

        return sum(await asyncio.gather(*(one() for _ in range(streams))))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specserve.bench.experiments.stream_floor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="1,16,64", help="concurrent client streams per level")
    parser.add_argument("--chunks", type=int, default=256, help="messages per stream")
    args = parser.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    port, ready = multiprocessing.Value("i", 0), multiprocessing.Event()
    server = multiprocessing.Process(target=serve, args=(port, ready, cores[-1] if len(cores) > 1 else None),
                                     daemon=True)
    server.start()
    ready.wait(30)
    if len(cores) > 1:
        os.sched_setaffinity(0, set(cores[:-1]))  # the clients off the server's core
    address = f"127.0.0.1:{port.value}"
    print("| mode | streams | messages/s | server us/message | server us/token |")
    print("|---|---|---|---|---|")
    try:
        for streams in (int(s) for s in args.streams.split(",")):
            for mode, per in MODES.items():
                asyncio.run(clients(address, streams, 8, mode))  # warm: channel, first calls
                before, start = cpu_seconds(server.pid), time.perf_counter()
                messages = asyncio.run(clients(address, streams, args.chunks, mode))
                seconds, cpu = time.perf_counter() - start, cpu_seconds(server.pid) - before
                print(f"| {mode} | {streams} | {messages / seconds:,.0f} | {1e6 * cpu / messages:,.1f} "
                      f"| {1e6 * cpu / (messages * per):,.1f} |", flush=True)
    finally:
        server.kill()


if __name__ == "__main__":
    main()
