"""The OpenAI-compatible HTTP API: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``.

It runs in the router process, on the router's event loop beside the gRPC server (measured against
Serve's HTTP proxy in ``bench/http_front.py`` (removed; in git history): docs/pages/api.md), and is a second
front on the same service: a body becomes the ``GenerateRequest`` a gRPC client would send, and
``SpecServeService.admit``/``run`` validate, admit, route and decode it as they do for gRPC. So the
limits, the messages that say what to fix and the greedy output are the gRPC API's.

What OpenAI's API has and specserve does not serve is refused with a 400 naming the field (n > 1,
echo, best_of, tool_choice auto), never silently ignored. ``logprobs`` (and chat's
``top_logprobs``) are the target's, whichever proposer drafted a token (workers/logprobs.py);
presence and frequency penalties and logit_bias process the target (workers/processors.py);
``response_format``, ``structured_outputs`` and tools called by name or as required constrain it
to a grammar (router/openai_structured.py, workers/grammar.py). Sampling defaults are
OpenAI's (temperature 1, top_p 1), not the gRPC API's greedy default. specserve's own fields (task,
speculation, draft, k, top_k) are accepted as extra body fields, and every response carries the
request's stats (the gRPC ``GenerateStats``, as JSON) in the extension field ``specserve``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import ssl
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from aiohttp import web
from google.protobuf.json_format import MessageToDict
from transformers import PreTrainedTokenizerBase

from specserve.proto.v1 import specserve_pb2 as pb
from specserve.workers.logprobs import TokenLogprobs
from specserve.workers.security import API_TOKEN_ENV, API_TOKEN_FILE_ENV, SecuritySettings

from .admission import Overloaded
from .openai_structured import FieldError, ToolMode, structured_output
from .segments import MAX_SEGMENT_CHARS
from .service import FAILURES, SpecServeService, Turn, stats_message, status_of
from .validation import InvalidRequest

log = logging.getLogger("specserve.router")
EXTENSION = "specserve"  # the response field with the request's stats
# OpenAI says "stop" for both ends; "grammar" (the structured output could take no further token) is ours.
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "grammar": "grammar"}
TOOL_CALLS = "tool_calls"  # the finish reason of an answer that is a tool call
SPECULATION = {"auto": pb.SPECULATION_AUTO, "on": pb.SPECULATION_ON, "off": pb.SPECULATION_OFF}
MAX_BODY_BYTES = 4 * 1024 * 1024  # far above any context window's text (validation bounds the prompt)
# OpenAI's fields that change the output in ways specserve does not serve: refused unless at the
# value that means "off".
UNSUPPORTED = {"echo": (None, False), "best_of": (None, 1),
               "suffix": (None, ""), "functions": (None, [])}
IGNORED = {"store", "service_tier", "parallel_tool_calls"}  # no effect on the output
# The request's segment (GenerateRequest.segment: counted per segment, router.segments): metadata's
# "segment" where given, else user, OpenAI's end-user id.
SEGMENT_FIELDS = ("user", "metadata")
SEGMENT_KEY = "segment"
SAMPLING_FIELDS = {"model", "max_tokens", "temperature", "top_p", "stop", "seed", "n", "stream", "stream_options",
                   "top_k", "task", "speculation", "draft", "k", "logprobs", "presence_penalty", "frequency_penalty",
                   "logit_bias", "response_format", "structured_outputs", *SEGMENT_FIELDS}
COMPLETION_FIELDS = SAMPLING_FIELDS | {"prompt"}  # logprobs: how many alternatives (0..20), as OpenAI's
CHAT_FIELDS = SAMPLING_FIELDS | {"messages", "max_completion_tokens", "top_logprobs",  # logprobs: true or false
                                 "tools", "tool_choice"}
CHAT_ROLES = ("system", "developer", "user", "assistant")
# HTTP status and OpenAI error type of each gRPC status the service answers with.
HTTP_STATUS = {grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
               grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
               grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
               grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
               grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable"),
               grpc.StatusCode.INTERNAL: (500, "internal_error")}


class ApiError(Exception):
    """An answer other than 200: the gRPC status it stands for, a message saying what to fix, and
    the request field at fault (OpenAI's ``param``)."""

    def __init__(self, code: grpc.StatusCode, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.param = code, param

    def body(self) -> dict:
        status, kind = HTTP_STATUS[self.code]
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code.name.lower()}}

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=HTTP_STATUS[self.code][0])


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(grpc.StatusCode.INVALID_ARGUMENT, message, param)


@dataclass(frozen=True)
class OpenAIRequest:
    """A body, checked for its shape and turned into the gRPC request the service validates."""

    generate: pb.GenerateRequest
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage counts
    chat: bool
    tools: ToolMode | None = None  # answered with a call of one of these (router/openai_structured.py)


def completion_request(body, model: str) -> OpenAIRequest:
    fields = _fields(body, COMPLETION_FIELDS)
    prompt = fields.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # the client's batch form, of one
    if not isinstance(prompt, str):
        raise invalid("prompt must be a string (or a list of one string): send one prompt per request; token-id "
                      "prompts are not accepted, send the text", "prompt")
    return _request(fields, prompt, model, chat=False)


def chat_request(body, model: str, tokenizer: PreTrainedTokenizerBase) -> OpenAIRequest:
    fields = _fields(body, CHAT_FIELDS)
    if "max_completion_tokens" in fields:  # the newer name of max_tokens
        if fields.get("max_tokens") is not None:
            raise invalid("give max_tokens or max_completion_tokens, not both", "max_completion_tokens")
        fields["max_tokens"] = fields.pop("max_completion_tokens")
    openai = _request(fields, "", model, chat=True)
    tools = list(openai.tools.tools) if openai.tools is not None else None
    openai.generate.prompt = chat_prompt(fields.get("messages"), tokenizer, tools)
    return openai


def chat_prompt(messages, tokenizer: PreTrainedTokenizerBase, tools: list[dict] | None = None) -> str:
    """The conversation as the target was trained to read it: its tokenizer's chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise invalid("the served model's tokenizer has no chat template, so it cannot read a conversation: use "
                      "/v1/completions with the text to continue", "messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages must be a non-empty list of {role, content} objects", "messages")
    turns = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
            raise invalid(f"messages[{i}] must be an object whose role is one of {', '.join(CHAT_ROLES)}",
                          f"messages[{i}].role")
        turns.append({"role": message["role"], "content": _content(message.get("content"), i)})
    try:
        # The tools, where the template shows them to the model (a template without them ignores them).
        text = tokenizer.apply_chat_template(turns, tools=tools, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # a template that raises (e.g. it wants alternating roles) says why
        raise invalid(f"the model's chat template refused these messages: {exc}", "messages") from None
    # Templates that write BOS as text (Llama 3's) would get a second one: the prompt's encoding
    # starts with exactly one BOS already (workers/prompt.py).
    bos = tokenizer.bos_token
    return text[len(bos):] if bos and text.startswith(bos) else text


def _content(content, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                         for p in content):
        return "".join(p["text"] for p in content)
    raise invalid(f"messages[{i}].content must be a string or a list of text parts ({{type: text, text}}); "
                  f"the served model reads text only", f"messages[{i}].content")


def _fields(body, known: set[str]) -> dict:
    if not isinstance(body, dict):
        raise invalid("the body must be a JSON object")
    fields = {}
    for name, value in body.items():
        if name in UNSUPPORTED:
            if value not in UNSUPPORTED[name]:
                raise invalid(f"{name} is not supported by specserve; leave it out", name)
        elif name in known:
            fields[name] = value
        elif name not in IGNORED:
            raise invalid(f"unknown field {name!r}; this endpoint takes {', '.join(sorted(known))}", name)
    n = fields.pop("n", None)
    if n not in (None, 1):
        raise invalid(f"n must be 1: specserve returns one choice per request (send {n!r} requests instead)", "n")
    return fields


def _request(fields: dict, prompt: str, model: str, chat: bool) -> OpenAIRequest:
    if fields.get("model") != model:
        raise ApiError(grpc.StatusCode.NOT_FOUND, f"model {fields.get('model')!r} is not served here; this service "
                       f"serves {model!r} (GET /v1/models)", "model")
    stream = _typed(fields, "stream", bool, False)
    options = fields.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise invalid("stream_options takes include_usage only", "stream_options")
    if options and not stream:
        raise invalid("stream_options needs stream: true", "stream_options")
    stop = fields.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid("stop must be a string or a list of strings", "stop")
    speculation = fields.get("speculation", "auto")
    if speculation not in SPECULATION:
        raise invalid(f"speculation must be one of {', '.join(SPECULATION)}, got {speculation!r}", "speculation")
    request = pb.GenerateRequest(prompt=prompt, stop=stops, speculation=SPECULATION[speculation],
                                 temperature=_number(fields, "temperature", 1.0), top_p=_number(fields, "top_p", 1.0),
                                 task=_typed(fields, "task", str, ""), draft=_typed(fields, "draft", str, ""),
                                 segment=_segment(fields))
    for name in ("presence_penalty", "frequency_penalty"):
        if fields.get(name) is not None:
            setattr(request, name, _number(fields, name, 0.0))
    bias = fields.get("logit_bias") or {}
    if not isinstance(bias, dict):
        raise invalid("logit_bias must be an object of token ids (as strings) to numbers", "logit_bias")
    for token, value in bias.items():
        try:
            request.logit_bias[int(token)] = float(value)
        except (TypeError, ValueError):
            raise invalid(f"logit_bias maps token ids to numbers, got {token!r}: {value!r}", "logit_bias") from None
    try:
        structured, tools = structured_output(fields, chat)
    except FieldError as exc:
        raise invalid(str(exc), exc.param) from None
    if structured is not None:
        request.structured_output.CopyFrom(structured)
    if chat:  # logprobs: whether; top_logprobs: how many alternatives
        top = _typed(fields, "top_logprobs", int, None)
        if _typed(fields, "logprobs", bool, False):
            request.logprobs = top or 0
        elif top:
            raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
    for name in ("max_tokens", "seed", "k", "top_k") + (() if chat else ("logprobs",)):
        value = _typed(fields, name, int, None)
        if value is not None:
            try:
                setattr(request, name, value)
            except ValueError:  # beyond the field's integer type: the range check would refuse it too
                raise invalid(f"{name} {value} is out of range", name) from None
    return OpenAIRequest(request, stream, bool(options.get("include_usage")), chat, tools)


def _segment(fields: dict) -> str:
    """metadata.segment, else user, else none; the rest of metadata is the client's own, taken as
    it comes. A long user id is cut to MAX_SEGMENT_CHARS: it could only count as "other" anyway
    (a listed segment is at most 64 characters)."""
    metadata = fields.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise invalid("metadata must be an object (its 'segment' names the request's segment)", "metadata")
    segment = metadata.get(SEGMENT_KEY)
    if segment is not None and not isinstance(segment, str):
        raise invalid(f"metadata.segment must be a string, got {segment!r}", "metadata")
    return segment or _typed(fields, "user", str, "")[:MAX_SEGMENT_CHARS]


def _typed(fields: dict, name: str, kind: type, default):
    value = fields.get(name)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise invalid(f"{name} must be {'an integer' if kind is int else f'a {kind.__name__}'}, got {value!r}", name)
    return value


def _number(fields: dict, name: str, default: float) -> float:
    value = fields.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(f"{name} must be a number, got {value!r}", name)
    return float(value)


class OpenAIServer:
    """The HTTP front: aiohttp on the loop that runs ``service`` (its state is that loop's alone)."""

    def __init__(self, service: SpecServeService, model: str, security: SecuritySettings,
                 serving: Callable[[], bool] = lambda: True) -> None:
        self.service = service
        self.serving = serving  # the router's health: False while no target replica is registered
        self.model = model
        self.security = security
        self.created = int(time.time())
        self.runner: web.AppRunner | None = None
        self.port = 0

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors], client_max_size=MAX_BODY_BYTES)
        app.add_routes([web.get("/v1/models", self.models), web.post("/v1/completions", self.completions),
                        web.post("/v1/chat/completions", self.chat_completions), web.get("/health", self.health)])
        return app

    async def start(self, host: str, port: int, reuse_port: bool = False) -> int:
        """Listen (port 0: one the OS picks; ``reuse_port``: beside the other router processes); the
        port listened on."""
        # handler_cancellation: a client that hangs up cancels its request, freeing its workers' sessions.
        self.runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port, ssl_context=self._ssl(), reuse_port=reuse_port or None)
        await site.start()
        self.port = self.runner.addresses[0][1]
        return self.port

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    def _ssl(self) -> ssl.SSLContext | None:
        """HTTPS with the client API's certificate when TLS is on (the same files as gRPC's)."""
        tls = self.security.tls
        if tls is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(tls.directory / "tls.crt", tls.directory / "tls.key")
        return context

    @web.middleware
    async def _errors(self, request: web.Request, handler) -> web.StreamResponse:
        """Every refusal in OpenAI's error shape; the token checked before anything else."""
        try:
            if request.path != "/health":
                self._authorize(request)
            return await handler(request)
        except ApiError as exc:
            return exc.response()
        except web.HTTPException as exc:  # aiohttp's own (unknown path, wrong method, body too large)
            code = grpc.StatusCode.NOT_FOUND if exc.status in (404, 405) else grpc.StatusCode.INVALID_ARGUMENT
            body = ApiError(code, f"{request.method} {request.path}: {exc.reason}").body()
            return web.json_response(body, status=exc.status)
        except (asyncio.CancelledError, ConnectionResetError):
            raise  # the client left: nobody to answer
        except Exception as exc:  # a bug: logged with its trace, answered in the API's shape
            log.exception("HTTP %s %s failed", request.method, request.path)
            return ApiError(grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__}); the router's log has "
                            f"the trace").response()

    def _authorize(self, request: web.Request) -> None:
        token = self.security.api_token
        if token is None:
            return
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise ApiError(grpc.StatusCode.UNAUTHENTICATED, f"missing or wrong API token: send the header "
                           f"'Authorization: Bearer <token>' with the token in {API_TOKEN_ENV} or {API_TOKEN_FILE_ENV}")

    async def health(self, request: web.Request) -> web.Response:
        """200 when the gRPC health service says SERVING, else 503: a probe of either API agrees."""
        if self.serving():
            return web.json_response({"status": "serving"})
        return web.json_response({"status": "not serving"}, status=503)

    async def models(self, request: web.Request) -> web.Response:
        model = {"id": self.model, "object": "model", "created": self.created, "owned_by": "specserve"}
        return web.json_response({"object": "list", "data": [model]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, completion_request(await _json(request), self.model))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat_request(await _json(request), self.model, self.service.tokenizer))

    async def _generate(self, request: web.Request, openai: OpenAIRequest) -> web.StreamResponse:
        try:
            turn = await self.service.admit(openai.generate)
        except (InvalidRequest, Overloaded) as exc:
            raise ApiError(status_of(exc), str(exc)) from None
        reply = _Reply(openai, self.model, self.service.tokenizer)
        try:
            if openai.stream:
                return await self._stream(request, turn, reply)
            texts, finish, ids, logprobs = [], None, [], None
            async with contextlib.aclosing(self.service.run(turn, None)) as chunks:
                async for chunk in chunks:
                    texts.append(chunk.text)
                    ids += chunk.token_ids
                    if chunk.logprobs is not None:
                        logprobs = chunk.logprobs if logprobs is None else logprobs.followed_by(chunk.logprobs)
                    finish = chunk.finish_reason or finish
            return web.json_response(reply.whole("".join(texts), finish, turn, ids, logprobs))
        except FAILURES as exc:
            raise _failure(exc) from None
        finally:
            turn.release()

    async def _stream(self, request: web.Request, turn: Turn, reply: _Reply) -> web.StreamResponse:
        """Server-sent events: a chunk per step, the last with the finish reason and the stats, the
        usage counts if asked, then [DONE]. A failure after the 200 is an error event."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        try:
            if reply.openai.chat:
                await _event(response, reply.chunk({"role": "assistant", "content": ""}, None, turn))
            held = None  # a tool call goes whole, once it has ended
            async with contextlib.aclosing(self.service.run(turn, None)) as chunks:
                async for chunk in chunks:
                    held = chunk if held is None else held.followed_by(chunk)
                    if reply.openai.tools is None or held.finish_reason:
                        await _event(response, reply.chunk(held.text, held.finish_reason, turn, held.token_ids,
                                                           held.logprobs))
                        held = None
            if reply.openai.include_usage:
                await _event(response, reply.usage_chunk(turn))
        except FAILURES as exc:
            await _event(response, _failure(exc).body())
        except ConnectionResetError:  # the client left; its turn is released by the caller
            return response
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


class _Reply:
    """The response bodies of one request, in OpenAI's shapes (completion or chat)."""

    def __init__(self, openai: OpenAIRequest, model: str, tokenizer: PreTrainedTokenizerBase) -> None:
        self.openai = openai
        self.model = model
        self.tokenizer = tokenizer  # a token's text, for logprobs
        self.id = f"{'chatcmpl' if openai.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.tokens = 0  # output tokens so far
        self.offset = 0  # characters of the completion's tokens so far (logprobs' text_offset)

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.openai.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, text: str, finish: str | None, turn: Turn, ids: list[int],
              logprobs: TokenLogprobs | None) -> dict:
        choice = {"index": 0, "finish_reason": FINISH.get(finish), "logprobs": self._logprobs(ids, logprobs)}
        choice |= {"message": {"role": "assistant", "content": text}} if self.openai.chat else {"text": text}
        if (call := self._call(text, finish)) is not None:
            choice |= {"message": {"role": "assistant", "content": None, "tool_calls": [call]},
                       "finish_reason": TOOL_CALLS}
        return self._head(False) | {"choices": [choice], "usage": self._usage(turn), EXTENSION: _stats(turn)}

    def chunk(self, piece: str | dict, finish: str | None, turn: Turn, ids: list[int] = (),
              logprobs: TokenLogprobs | None = None) -> dict:
        choice = {"index": 0, "finish_reason": FINISH.get(finish) if finish else None,
                  "logprobs": self._logprobs(list(ids), logprobs)}
        if (call := self._call(piece, finish)) is not None:
            choice |= {"delta": {"tool_calls": [{"index": 0} | call]}, "finish_reason": TOOL_CALLS}
        elif self.openai.chat:
            choice["delta"] = piece if isinstance(piece, dict) else ({"content": piece} if piece else {})
        else:
            choice["text"] = piece
        body = self._head(True) | {"choices": [choice]}
        if finish:
            body[EXTENSION] = _stats(turn)
        return body

    def _call(self, text, finish: str | None) -> dict | None:
        """The tool call the whole output is, for a request answered with one (None: it is not one,
        or was cut short by max_tokens, and goes as text)."""
        if self.openai.tools is None or finish != "eos" or not isinstance(text, str):
            return None
        return self.openai.tools.call(text)

    def _logprobs(self, ids: list[int], logprobs: TokenLogprobs | None) -> dict | None:
        """The tokens' logprobs in OpenAI's shape: chat's ``content`` list, or the completions API's
        parallel lists (tokens, token_logprobs, top_logprobs, text_offset). Counts the tokens."""
        self.tokens += len(ids)
        if logprobs is None:
            return None
        text = lambda token: self.tokenizer.decode([token])  # noqa: E731
        if self.openai.chat:
            entry = lambda token, value: {"token": text(token), "logprob": value,  # noqa: E731
                                          "bytes": list(text(token).encode())}
            return {"content": [entry(token, chosen) | {"top_logprobs": [entry(i, v) for i, v in zip(top_ids, top)]}
                                for token, chosen, top_ids, top in zip(ids, logprobs.chosen, logprobs.top_ids,
                                                                       logprobs.top, strict=True)]}
        tokens, offsets = [text(token) for token in ids], []
        for token in tokens:
            offsets.append(self.offset)
            self.offset += len(token)
        return {"tokens": tokens, "token_logprobs": logprobs.chosen, "text_offset": offsets,
                "top_logprobs": [{text(i): v for i, v in zip(top_ids, top)} for top_ids, top in
                                 zip(logprobs.top_ids, logprobs.top, strict=True)]}

    def usage_chunk(self, turn: Turn) -> dict:
        return self._head(True) | {"choices": [], "usage": self._usage(turn)}

    def _usage(self, turn: Turn) -> dict:
        prompt = len(turn.request.prompt_ids)
        cached = turn.running.target.cached_tokens if turn.running is not None else 0
        return {"prompt_tokens": prompt, "completion_tokens": self.tokens, "total_tokens": prompt + self.tokens,
                "prompt_tokens_details": {"cached_tokens": cached}}


def _stats(turn: Turn) -> dict:
    return MessageToDict(stats_message(turn.running), preserving_proto_field_name=True,
                         always_print_fields_with_no_presence=True)


def _failure(exc: Exception) -> ApiError:
    details = f"a worker answered {exc.code().name}: {exc.details()}" if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
    return ApiError(status_of(exc), details)


async def _json(request: web.Request):
    try:
        return json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid(f"the body is not valid JSON: {exc}") from None


async def _event(response: web.StreamResponse, body: dict) -> None:
    await response.write(b"data: " + json.dumps(body).encode() + b"\n\n")

