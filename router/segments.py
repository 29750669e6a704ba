"""Request segments: who a request is for (a user segment, a tenant, a product surface), counted
under a bounded set of names so that acceptance and speedup can be watched per segment.

The operator lists the names (router.segments); a request naming one of them is counted under it,
one naming anything else under "other", and one naming none under "" (no segment). Metrics labels
and GetStats rows therefore have at most len(router.segments) + 2 values, whatever clients send.
"""

from __future__ import annotations

import re
from collections.abc import Container

SEGMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # what router.segments may list
OTHER_SEGMENT = "other"  # every segment the operator did not list
MAX_SEGMENTS = 100  # names router.segments may list: each is a label value on several metrics
MAX_SEGMENT_CHARS = 256  # a request's segment, as sent (an OpenAI user id fits)


def counted_segment(segment: str, listed: Container[str]) -> str:
    """The name a request's ``segment`` is counted under."""
    if not segment:
        return ""
    return segment if segment in listed else OTHER_SEGMENT
