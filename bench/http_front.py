"""Per-request overhead of the two places the OpenAI-compatible HTTP API could run, side by side:

  A  Serve's HTTP proxy (serve.start(http_options=...)): the proxy actor parses HTTP and calls the
     router deployment's ``__call__`` through a DeploymentHandle (a second process hop);
  B  an aiohttp server the replica starts itself on its own event loop, as the router does
     (router/openai_api.py): HTTP is parsed in the process that runs the request.

Neither does any work: POST /v1/completions returns a fixed completion body; with "stream": true
it sends 32 server-sent events and [DONE]. One keep-alive connection per front (as the openai
client keeps); the driver alternates A and B calls and prints unary latency (median, p90) and
streaming latency (first event, whole stream, per event; medians), with the ratio B/A.

    .venv/bin/python bench/http_front.py [--calls 300] [--streams 50]
"""

from __future__ import annotations

import http.client
import json
import time

import ray
from ray import serve

from specserve.bench.router_front import CHUNKS, alternate, free_port, parse_args, report

APP = "bench"
BODY = {"id": "cmpl-x", "object": "text_completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "text": "x" * 64, "finish_reason": "length", "logprobs": None}],
        "usage": {"prompt_tokens": 8, "completion_tokens": CHUNKS, "total_tokens": 8 + CHUNKS}}


def events():
    for i in range(CHUNKS):
        yield b"data: " + json.dumps({"choices": [{"index": 0, "text": "x", "finish_reason": None}]}).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Front:
    def __init__(self) -> None:
        import asyncio
        import threading

        from aiohttp import web

        async def completions(request):  # front B
            body = await request.json()
            if not body.get("stream"):
                return web.json_response(BODY)
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for event in events():
                await response.write(event)
            await response.write_eof()
            return response

        app = web.Application()
        app.add_routes([web.post("/v1/completions", completions)])
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

        async def start():
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            return runner.addresses[0][1]

        self.own_port = asyncio.run_coroutine_threadsafe(start(), self.loop).result(30)

    def port(self) -> int:
        return self.own_port

    async def __call__(self, request):  # front A: Serve's HTTP proxy calls this
        from starlette.responses import JSONResponse, StreamingResponse

        body = await request.json()
        if not body.get("stream"):
            return JSONResponse(BODY)
        return StreamingResponse(events(), media_type="text/event-stream")


def post(conn: http.client.HTTPConnection, path: str, stream: bool) -> tuple[float, float]:
    """(seconds to the first body bytes, seconds for the whole response)."""
    payload = json.dumps({"model": "m", "prompt": "hello", "max_tokens": CHUNKS, "stream": stream})
    start = time.perf_counter()
    conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    first = None
    data = b""
    while chunk := response.read1(65536) if stream else response.read():
        first = first or time.perf_counter() - start
        data += chunk
        if not stream:
            break
    total = time.perf_counter() - start
    if response.status != 200 or (stream and data.count(b"data: ") != CHUNKS + 1):
        raise RuntimeError(f"{path}: status {response.status}, {data[:200]!r}")
    return first or total, total


def main() -> None:
    args = parse_args(__doc__)
    ray.init(include_dashboard=False, log_to_driver=False, object_store_memory=100 * 1024 * 1024)
    try:
        proxy_port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": proxy_port})
        handle = serve.run(Front.bind(), name=APP, route_prefix="/")
        own_port = handle.port.remote().result()
        fronts = {"A serve proxy": http.client.HTTPConnection("127.0.0.1", proxy_port),
                  "B own server": http.client.HTTPConnection("127.0.0.1", own_port)}
        results = alternate(fronts, lambda conn: post(conn, "/v1/completions", stream=False)[1],
                            lambda conn: post(conn, "/v1/completions", stream=True), args)
        report(results, args)
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
