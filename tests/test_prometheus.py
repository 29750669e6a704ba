"""The dashboard's queries against a real Prometheus scraping the test cluster: after greedy, sampled
and refused requests on every task, every panel's PromQL, its Grafana variables filled in, returns
series with a value, and still does once the service has been idle for longer than Ray keeps a
gauge it was not sent again. `make test-slow` fetches Debian's prometheus package into
.venv/prometheus and puts it on PATH for this test; it skips, saying so, where there is none."""

from __future__ import annotations

import math
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from specserve.bench.prometheus import Prometheus
from specserve.proto.v1 import specserve_pb2 as pb

from conftest import LISTED_SEGMENT, dashboard_queries, free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("prometheus") is None,
                       reason="no prometheus on PATH: `make test-slow` fetches Debian's package into .venv/prometheus"),
]

SCRAPE_SECONDS = 1
# Every rate and range covers the whole test (Prometheus starts before the traffic), so what the
# traffic recorded is in every window however long Ray takes to report it.
WINDOW = "5m"
GRAFANA_VARIABLES = {"$__rate_interval": WINDOW, "$__range": WINDOW, "$__interval": WINDOW, "$task": ".*"}
DATA_WAIT_SECONDS = 90.0  # the test cluster's Ray reports metrics every ~2 s; a busy host is slower
# Ray's metrics agent drops a gauge it was not sent for two of its reports (10 s by default); in
# this cluster an idle router's gauges left the scrape ~20 s after the last request.
IDLE_SECONDS = 40.0
ROUNDS = 2  # of traffic, apart, so the counters rise between scrapes and rates are not 0
CLIENTS = 4  # at once, within the service's concurrency limit (conftest.SERVICE_CONCURRENCY)


def concrete(expr: str) -> str:
    """A panel's PromQL as Prometheus takes it: Grafana's variables replaced by values."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"a Grafana variable this test does not fill in: {expr!r}"
    return expr


def has_a_value(response: dict) -> bool:
    """A vector of at least one series, one of them a number (0/0 and quantiles of nothing are NaN)."""
    return any(math.isfinite(float(series["value"][1])) for series in response["data"]["result"])


@pytest.fixture
def prometheus(tmp_path, metrics_port):
    """A Prometheus scraping the test cluster's metrics port every second."""
    with Prometheus(tmp_path / "prometheus", metrics_port, free_port(), SCRAPE_SECONDS) as running:
        yield running


def requests(zoo) -> list[pb.GenerateRequest]:
    """Greedy and sampled requests on every task, one naming its draft, one left to the classifier;
    the greedy ones name a segment (the dashboard's Segments row)."""
    out = []
    for task in zoo.tasks:
        for i, prompt in enumerate(zoo.prompts(task)[:2]):
            out += [pb.GenerateRequest(prompt=prompt, max_tokens=24, task=task, segment=LISTED_SEGMENT),
                    pb.GenerateRequest(prompt=prompt, max_tokens=24, task=task, temperature=0.8, seed=i + 1),
                    pb.GenerateRequest(prompt=prompt, max_tokens=24, task=task, draft=task,
                                       speculation=pb.SPECULATION_ON)]
        out.append(pb.GenerateRequest(prompt=zoo.prompts(task)[2], max_tokens=24))
    out.append(pb.GenerateRequest(prompt=zoo.prompts(zoo.tasks[0])[0], max_tokens=24, task="general"))  # its tree
    return out


def send_traffic(client, zoo) -> None:
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(client.generate, requests(zoo)))  # raises what a request raised
    with pytest.raises(grpc.RpcError):  # refused at the edge: an error for the error panel
        client.generate(pb.GenerateRequest(prompt="x", temperature=-1.0))


def without_data(prometheus: Prometheus, queries: list[tuple[str, str]]) -> list[tuple[str, str, dict]]:
    """(panel title, PromQL, Prometheus's answer) for each query that returns no value now."""
    answers = [(title, expr, prometheus.api("query", query=expr)) for title, expr in queries]
    return [(title, expr, answer) for title, expr, answer in answers if not has_a_value(answer)]


def report(missing: list[tuple[str, str, dict]]) -> str:
    return "\n\n".join(f"panel {title!r}: no data for\n{expr}\nPrometheus answered {answer}"
                       for title, expr, answer in missing)


def test_every_dashboard_query_returns_data_from_a_real_scrape(prometheus, client, tiny_zoo):
    for round_ in range(ROUNDS):
        if round_:
            time.sleep(3 * SCRAPE_SECONDS + 2)  # a Ray report and a scrape between the rounds
        send_traffic(client, tiny_zoo)
    queries = [(title, concrete(expr)) for title, expr in dashboard_queries()]
    deadline = time.monotonic() + DATA_WAIT_SECONDS
    while (missing := without_data(prometheus, queries)) and time.monotonic() < deadline:
        time.sleep(2)
    assert not missing, report(missing)
    time.sleep(IDLE_SECONDS)  # what an operator sees between bursts of traffic
    missing = without_data(prometheus, queries)
    assert not missing, f"after {IDLE_SECONDS:.0f} s idle:\n{report(missing)}"
