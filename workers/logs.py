"""Logs of the processes Ray starts (target replicas, draft workers, the router).

Ray and Serve configure their own loggers in the processes they start, not ``specserve``'s: without
this, specserve's INFO lines there (a worker ready, the pool scaled, a replica drained) would fall
to Python's last-resort handler, which prints warnings only. Each such process sends them to its
stderr, which Ray keeps in its session's logs and forwards to the driver's terminal.
"""

from __future__ import annotations

import logging
import os
import sys

LEVEL_ENV = "SPECSERVE_LOG_LEVEL"  # INFO unless set (DEBUG, WARNING, ...)
FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def log_to_stderr() -> None:
    """Once per process: specserve's records at ``SPECSERVE_LOG_LEVEL`` (INFO) and above to stderr."""
    logger = logging.getLogger("specserve")
    if any(getattr(h, "specserve", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.specserve = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(os.environ.get(LEVEL_ENV, "INFO").upper())
    logger.propagate = False  # not twice where the root logger has a handler too
