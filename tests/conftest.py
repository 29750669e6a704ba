"""Shared fixtures: one tiny zoo per test session (built for real: corpora, tokenizer, training,
distillation), in a temporary SPECSERVE_HOME so tests never touch the user's cache."""

from __future__ import annotations

import pytest

from specserve.workers.zoo.build import build_zoo
from specserve.workers.zoo.presets import get_preset
from specserve.workers.zoo.zoo import Zoo


@pytest.fixture(scope="session")
def specserve_home(tmp_path_factory) -> str:
    home = tmp_path_factory.mktemp("specserve-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECSERVE_HOME", str(home))
    yield str(home)
    mp.undo()


@pytest.fixture(scope="session")
def tiny_zoo(specserve_home) -> Zoo:
    from pathlib import Path

    return build_zoo(get_preset("tiny"), Path(specserve_home) / "zoo" / "tiny")


@pytest.fixture(scope="session")
def tiny_engine(tiny_zoo):
    from specserve.cluster.local import zoo_engine

    return zoo_engine(tiny_zoo, tiny_zoo.draft_names)


@pytest.fixture(scope="session")
def service(tiny_zoo):
    """The service on a real embedded Ray cluster, serving the tiny zoo; one per test session.

    The concurrency limit is low so the RESOURCE_EXHAUSTED test can reach it.
    """
    from specserve.cluster.bringup import start_service

    running = start_service(port=0, overrides={"models": {"zoo": str(tiny_zoo.root)},
                                               "router": {"max_concurrent_requests": SERVICE_CONCURRENCY}})
    yield running
    running.stop()


SERVICE_CONCURRENCY = 6


@pytest.fixture(scope="session")
def client(service):
    from specserve.cluster.client import SpecServeClient

    c = SpecServeClient(service.address)
    yield c
    c.close()
