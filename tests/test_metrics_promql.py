"""The Grafana dashboard against the metrics code, without Ray running: every derived figure it
charts is the PromQL that router/metrics.py's docstring defines (DERIVED_PROMQL), every query reads
only series and labels the router's and the draft pool's metrics export (as Ray names them), and
every metric and every figure is charted. Whether the queries return data from a real scrape: tests/test_prometheus.py."""

from __future__ import annotations

import json
import re

import pytest
from ray.util import metrics

from specserve.router.metrics import DERIVED_PROMQL, PoolMetrics, RouterMetrics

from conftest import DASHBOARD, dashboard_queries

SERIES = re.compile(r"\b(ray_\w+)(?:\{([^}]*)\})?")  # a series name and its label matchers
MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")


def one_line(expr: str) -> str:
    """PromQL with its whitespace collapsed, as DERIVED_PROMQL holds it."""
    return " ".join(expr.split())


@pytest.fixture(scope="module")
def exported() -> dict[str, dict[str, set[str]]]:
    """{metric name: {series name Ray exports for it: the labels that series carries}}."""
    series = {}
    for metric in (*vars(RouterMetrics()).values(), *vars(PoolMetrics()).values()):
        if not isinstance(metric, metrics.Metric):
            continue
        name, labels = metric.info["name"], set(metric.info["tag_keys"])
        full = f"ray_{name}"
        if isinstance(metric, metrics.Histogram):
            series[name] = {f"{full}_bucket": labels | {"le"}, f"{full}_sum": labels, f"{full}_count": labels}
        elif isinstance(metric, metrics.Counter):
            series[name] = {f"{full}_total": labels}
        else:
            series[name] = {full: labels}
    return series


def all_queries() -> list[tuple[str, str]]:
    """(where, PromQL) for the dashboard's queries and the docstring's figures."""
    return dashboard_queries() + [(f"DERIVED_PROMQL[{name!r}]", expr) for name, expr in DERIVED_PROMQL.items()]


def test_the_docstring_defines_the_figures_the_dashboard_derives():
    assert {"goodput", "acceptance_rate", "tokens_per_pass", "pass_width"} <= set(DERIVED_PROMQL)
    for name, expr in DERIVED_PROMQL.items():
        assert name.isidentifier() and expr == one_line(expr) and "ray_specserve_" in expr, (name, expr)


def test_every_ratio_the_dashboard_charts_is_a_docstring_figure():
    figures = set(DERIVED_PROMQL.values())
    for title, expr in dashboard_queries():
        assert one_line(expr) in figures or "/" not in expr, (
            f"panel {title!r} divides in its own PromQL: {expr!r}; define the figure in router/metrics.py's "
            f"docstring and chart that")


def test_every_docstring_figure_is_charted():
    charted = {one_line(expr) for _, expr in dashboard_queries()}
    assert not {name for name, expr in DERIVED_PROMQL.items() if expr not in charted}


def test_every_query_reads_series_and_labels_the_router_exports(exported):
    labels_of = {series: labels for by_series in exported.values() for series, labels in by_series.items()}
    for where, expr in all_queries():
        read = SERIES.findall(expr)
        assert read, f"{where} reads no ray_ series: {expr!r}"
        for series, matchers in read:
            assert series in labels_of, f"{where} reads {series}, which no router metric exports"
            unknown = set(MATCHER.findall(matchers)) - labels_of[series]
            assert not unknown, f"{where} matches {series} on labels it does not carry: {unknown}"
        carried = set().union(*(labels_of[series] for series, _ in read))
        grouped = {label.strip() for group in GROUPING.findall(expr) for label in group.split(",") if label.strip()}
        assert grouped <= carried, f"{where} groups by labels none of its series carries: {grouped - carried}"


def test_every_router_metric_is_charted(exported):
    text = " ".join(expr for _, expr in dashboard_queries())
    read = {series for series, _ in SERIES.findall(text)}
    assert not {name for name, by_series in exported.items() if not read & set(by_series)}


def test_panel_ids_are_unique():
    ids = [panel["id"] for panel in json.loads(DASHBOARD.read_text())["panels"]]
    assert len(ids) == len(set(ids))
