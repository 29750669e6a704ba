"""What several `specserve` commands share: the security epilog, the default zoo, and the argument
types of comma-separated lists and of ``--set KEY=VALUE`` overrides (bench's commands use them too)."""

from __future__ import annotations

import argparse

from specserve.workers.security import (API_TOKEN_ENV, API_TOKEN_FILE_ENV, INTERNAL_TOKEN_ENV, INTERNAL_TOKEN_FILE_ENV,
                                        TLS_DIR_ENV)

from ..config import ModelsConfig

DEFAULT_ZOO = ModelsConfig().zoo  # what --zoo means when not given: the service's
SECURITY_EPILOG = (  # argparse rewraps it
    f"Security comes from the environment, never from flags or the Serve config: {API_TOKEN_ENV} (or "
    f"{API_TOKEN_FILE_ENV}, a file holding it) is the client API's bearer token, required by `serve` and sent by "
    f"the commands that call a service; {INTERNAL_TOKEN_ENV} (or {INTERNAL_TOKEN_FILE_ENV}) is the token the "
    f"router presents to the workers; {TLS_DIR_ENV} is a directory with tls.crt, tls.key and ca.crt, turning on "
    f"TLS for the client API and mutual TLS between router and workers (a client needs only ca.crt). "
    f"See docs/pages/security.md.")


def add_zoo_argument(parser: argparse.ArgumentParser, note: str = "") -> None:
    parser.add_argument("--zoo", default=DEFAULT_ZOO, help=f"a zoo preset name or a zoo directory {note}(default: %(default)s)")


def comma_ints(text: str) -> tuple[int, ...]:
    """The type of a flag such as ``--concurrency 1,2,4``."""
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def comma_list(text: str) -> tuple[str, ...]:
    """The type of a flag such as ``--tasks sql,code``."""
    return tuple(v.strip() for v in text.split(",") if v.strip())


def comma_floats(text: str) -> tuple[float, ...]:
    """The type of a flag such as ``--temperatures 0.7,1.0``."""
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def dotted_overrides(items: list[str]) -> dict:
    """["router.policy.k_max=16"] -> {"router": {"policy": {"k_max": 16}}}; the service's config
    validation then refuses unknown keys and bad values with its usual message."""
    import yaml

    overrides: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        *parents, leaf = key.split(".")
        node = overrides
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return overrides
