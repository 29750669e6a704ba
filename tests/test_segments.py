"""Request segments (issue: alpha watched per task, draft and segment): a request names who it is
for; the operator's router.segments bounds what is counted under its own name ("other" for the
rest). Pure parts without Ray (the counting, the config, the edge's checks, the OpenAI fields), then
the session's service: the reply says the segment as counted, GetStats has a row per (task, draft,
segment) priced by the cost model, and the metrics carry the label."""

from __future__ import annotations

import time
import urllib.request

import pytest
from pydantic import ValidationError

from specserve.proto.v1 import specserve_pb2 as pb
from specserve.router.config import RouterConfig
from specserve.router.segments import MAX_SEGMENT_CHARS, OTHER_SEGMENT, counted_segment
from specserve.workers.stats import alpha

from conftest import LISTED_SEGMENT

METRICS_WAIT_SECONDS = 30.0  # the embedded cluster reports every 2 s


def test_a_listed_segment_counts_as_itself_any_other_as_other_and_none_as_none():
    listed = frozenset({"enterprise", "free"})
    assert counted_segment("enterprise", listed) == "enterprise"
    assert counted_segment("user-81723", listed) == OTHER_SEGMENT
    assert counted_segment("", listed) == ""
    assert counted_segment("enterprise", frozenset()) == OTHER_SEGMENT


@pytest.mark.parametrize("segments,words", [((OTHER_SEGMENT,), "not 'other'"), (("has space",), "1-64 letters"),
                                            (("-dash",), "starting with a letter"), (("a", "a"), "different names"),
                                            (tuple(f"s{i}" for i in range(101)), "at most 100")])
def test_the_operators_list_is_refused_with_what_to_fix(segments, words):
    with pytest.raises(ValidationError, match=words):
        RouterConfig(segments=segments)
    assert RouterConfig(segments=("enterprise", "free.tier", "team_9")).segments


def test_a_segment_too_long_is_refused_at_the_edge(tiny_engine):
    from specserve.router.validation import InvalidRequest, Limits, validate

    limits = Limits(tasks={"sql": ("sql",)}, drafts=("sql",), context_window=tiny_engine.context_window,
                    segments=frozenset({"enterprise"}))
    ok = validate(pb.GenerateRequest(prompt="SELECT", segment="enterprise"), tiny_engine.tokenizer, limits)
    assert ok.segment == "enterprise"
    assert validate(pb.GenerateRequest(prompt="SELECT", segment="u" * MAX_SEGMENT_CHARS), tiny_engine.tokenizer,
                    limits).segment == OTHER_SEGMENT
    with pytest.raises(InvalidRequest, match=f"segment is {MAX_SEGMENT_CHARS + 1} characters; at most"):
        validate(pb.GenerateRequest(prompt="SELECT", segment="u" * (MAX_SEGMENT_CHARS + 1)), tiny_engine.tokenizer,
                 limits)


def test_openais_metadata_segment_else_user_names_the_segment():
    from specserve.router.openai_api import ApiError, _request

    def segment(**fields) -> str:
        return _request({"model": "m", **fields}, "hi", "m", chat=False).generate.segment

    assert segment(user="user-1") == "user-1"
    assert segment(user="user-1", metadata={"segment": "enterprise", "trace": "x"}) == "enterprise"
    assert segment(metadata={"trace": "x", "n": 3}) == "" and segment() == ""  # the client's own, as it comes
    assert segment(user="u" * 1000) == "u" * MAX_SEGMENT_CHARS  # cut: it could only count as "other"
    with pytest.raises(ApiError, match="metadata.segment must be a string, got 3"):
        segment(metadata={"segment": 3})


def test_the_service_counts_acceptance_and_speedup_per_segment(client, tiny_zoo, metrics_port):
    prompts = tiny_zoo.prompts("sql")
    sent = {LISTED_SEGMENT: 0, "tenant-4711": 0, "": 0}
    for i, prompt in enumerate(prompts[:6]):
        for segment in sent:
            reply = client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=12, task="sql", draft="sql",
                                                       speculation=pb.SPECULATION_ON, segment=segment))
            assert reply.stats.segment == counted_segment(segment, {LISTED_SEGMENT})
            sent[segment] += 1
    rows = {(s.task, s.draft, s.segment): s for s in client.stats().segments}
    assert ("sql", "sql", "") not in rows  # a request that named no segment has no segment's row
    for segment in (LISTED_SEGMENT, OTHER_SEGMENT):
        row = rows[("sql", "sql", segment)]
        assert row.requests >= 6 and row.proposed_tokens > 0 and row.target_passes > 0
        assert row.alpha == pytest.approx(alpha(row.accepted_tokens, row.rejections))
        assert row.expected_speedup > 0 and row.k >= 1  # priced by the policy's model of the sql draft
    deadline = time.monotonic() + METRICS_WAIT_SECONDS
    wanted = ["ray_specserve_accepted_tokens_total", "ray_specserve_rejections_total",
              "ray_specserve_segment_expected_speedup"]
    while True:
        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        found = {name for line in body.splitlines() for name in wanted
                 if line.startswith(name + "{") and f'segment="{LISTED_SEGMENT}"' in line and 'task="sql"' in line}
        if found == set(wanted):
            break
        assert time.monotonic() < deadline, f"no {sorted(set(wanted) - found)} with segment={LISTED_SEGMENT!r}"
        time.sleep(1.0)
