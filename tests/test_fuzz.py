"""Random and malformed GenerateRequests over real gRPC: every one gets a defined status, no worker
goes down, and valid traffic running alongside keeps its exact output.

The requests are raw wire bytes, so they can carry what a protobuf library would refuse to build:
invalid UTF-8 in string fields, truncated or garbage messages, out-of-range enum values. The
default budget runs in `make test`; `SPECSERVE_FUZZ_EXAMPLES` or the slow variant raise it.
"""

from __future__ import annotations

import os
import threading

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specserve.proto.v1 import specserve_pb2 as pb

# What the service may answer to anything at all. UNAVAILABLE, INTERNAL or UNKNOWN would mean a
# request reached something that broke.
DEFINED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
EXAMPLES = int(os.environ.get("SPECSERVE_FUZZ_EXAMPLES", "300"))
SLOW_EXAMPLES = 3000
INT32 = st.integers(-(2**31), 2**31 - 1)
FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=32)
TEXT = st.one_of(st.text(max_size=40), st.text(alphabet=st.characters(max_codepoint=0x1F), max_size=20),
                 st.sampled_from(["sql", "code", "math", "prose", "general", "SELECT", "\x00", "é" * 70]))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def raw_string_field(number: int, data: bytes) -> bytes:
    """A length-delimited field with any bytes in it (protobuf will not build invalid UTF-8)."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


@st.composite
def wire_requests(draw) -> bytes:
    """A GenerateRequest's bytes: fields in and out of range, sometimes corrupted."""
    request = pb.GenerateRequest(prompt=draw(st.one_of(TEXT, st.just("x" * draw(st.integers(0, 300_000))))))
    for field, values in (("max_tokens", st.one_of(st.integers(1, 64), INT32)), ("temperature", FLOATS),
                          ("top_p", FLOATS), ("top_k", INT32), ("seed", st.integers(0, 2**64 - 1)),
                          ("k", st.one_of(st.integers(1, 16), INT32))):
        if draw(st.booleans()):
            setattr(request, field, draw(values))
    # Mostly the defaults and valid names, or nearly every request would fail on one field alone.
    request.stop.extend(draw(st.one_of(st.just([]), st.lists(TEXT, max_size=10))))
    names = st.one_of(st.just(""), st.sampled_from(["sql", "code", "math", "prose", "general"]), TEXT)
    request.task, request.draft = draw(names), draw(names)
    data = request.SerializeToString()
    speculation = draw(st.integers(0, 5))  # 3.. are not Speculation values
    if speculation:
        data += _varint(9 << 3) + _varint(speculation)
    corruption = draw(st.sampled_from(["none", "bad utf-8", "truncated", "garbage"]))
    if corruption == "bad utf-8":  # appended: the last value of a field wins
        field = draw(st.sampled_from([1, 7, 8, 10]))  # prompt, stop, task, draft
        data += raw_string_field(field, draw(st.binary(min_size=1, max_size=8)) + b"\xff\xfe")
    elif corruption == "truncated" and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif corruption == "garbage":
        data = draw(st.binary(max_size=200))
    return data


def call_raw(channel: grpc.Channel, data: bytes) -> tuple[grpc.StatusCode, bytes | None]:
    generate = channel.unary_unary("/specserve.v1.SpecServe/Generate", request_serializer=None,
                                   response_deserializer=None)
    try:
        return grpc.StatusCode.OK, generate(data, timeout=60)
    except grpc.RpcError as exc:
        return exc.code(), None


class ValidTraffic:
    """Greedy requests in a loop beside the fuzzing; each must equal its first answer."""

    def __init__(self, client, prompts: list[str]) -> None:
        self.requests = [pb.GenerateRequest(prompt=p, max_tokens=12) for p in prompts]
        self.expected = [list(client.generate(r).token_ids) for r in self.requests]
        self.client, self.sent, self.wrong = client, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            i = self.sent % len(self.requests)
            try:
                got = list(self.client.generate(self.requests[i], timeout=60).token_ids)
            except grpc.RpcError as exc:  # over the limit is a defined answer; anything else is not
                got = exc.code() if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED else self.expected[i]
            if got != self.expected[i]:
                self.wrong.append((self.requests[i].prompt, got))
            self.sent += 1

    def __enter__(self) -> ValidTraffic:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


def fuzz(service, client, tiny_zoo, examples: int, derandomize: bool) -> None:
    answers: dict[grpc.StatusCode, int] = {}

    @settings(max_examples=examples, deadline=None, derandomize=derandomize, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=wire_requests())
    def one(data: bytes) -> None:
        code, response = call_raw(channel, data)
        assert code in DEFINED, (code, data[:200])
        if code == grpc.StatusCode.OK:
            assert pb.GenerateResponse.FromString(response).finish_reason != pb.FINISH_REASON_UNSPECIFIED
        answers[code] = answers.get(code, 0) + 1

    workers_before = {(w.kind, w.worker_id) for w in client.stats().workers}
    prompts = [tiny_zoo.prompts(task)[0] for task in tiny_zoo.tasks]
    with grpc.insecure_channel(service.address) as channel, ValidTraffic(client, prompts) as traffic:
        one()
    assert traffic.sent > 0 and not traffic.wrong, traffic.wrong[:3]
    assert answers.get(grpc.StatusCode.INVALID_ARGUMENT) and answers.get(grpc.StatusCode.OK), answers
    assert {(w.kind, w.worker_id) for w in client.stats().workers} == workers_before  # nobody went down
    assert client.health() == 1  # SERVING


def test_malformed_requests_get_defined_statuses_and_hurt_nothing(service, client, tiny_zoo):
    fuzz(service, client, tiny_zoo, EXAMPLES, derandomize=True)


@pytest.mark.slow
def test_malformed_requests_longer_budget(service, client, tiny_zoo):
    fuzz(service, client, tiny_zoo, SLOW_EXAMPLES, derandomize=False)
