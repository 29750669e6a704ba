"""The alert rules shipped with the manifests (deploy/alerts/specserve-rules.yaml), under promtool:
they parse, each fires on the series written for it and stays silent on the others
(tests/alerts/specserve-rules.test.yaml), and each broken on purpose fails those tests, so the tests
can see what they claim. The PrometheusRule for the Prometheus Operator carries the same groups.

promtool comes with Debian's prometheus package, which `make test` unpacks into .venv/prometheus
and puts on PATH; where it cannot (no apt), these tests skip, saying so."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from specserve.cluster.kuberay import ALERT_RULES, PROMETHEUS_RULE, prometheus_rule

REPOSITORY = Path(__file__).parents[1]
RULE_TESTS = REPOSITORY / "tests" / "alerts" / "specserve-rules.test.yaml"
PROMTOOL = shutil.which("promtool") or shutil.which("promtool", path=str(REPOSITORY / ".venv" / "prometheus" / "usr" / "bin"))
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="no promtool on PATH: `make test` fetches Debian's "
                                                             "prometheus package into .venv/prometheus")

# One mistake per alert, each one a rule could plausibly be written with: the firing case must catch it.
BROKEN = {
    "SpecServeAcceptanceBelowBaseline": (" - 0.10\n", " - 0.30\n"),  # a margin wider than the drift
    "SpecServeDraftBelowBreakEven": (") < 1\n", ") < 0.5\n"),  # break-even misplaced
    "SpecServeSpeculationDisabled": ("[1d])) == 1", "[1d])) == 0"),  # "never speculated" for "stopped"
    "SpecServeDraftPoolSaturated": ('{kind="draft"}', '{kind="target"}'),  # the target's queue for the pool's
}


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "PROMETHEUS_URL"})


@needs_promtool
def test_the_rules_parse_and_each_alert_fires_on_its_series_and_only_there():
    checked = promtool("check", "rules", str(ALERT_RULES), cwd=ALERT_RULES.parent)
    assert checked.returncode == 0 and f"SUCCESS: {len(BROKEN)} rules found" in checked.stdout, checked.stdout + checked.stderr
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


@needs_promtool
@pytest.mark.parametrize("alert", sorted(BROKEN))
def test_a_broken_rule_fails_its_test(alert, tmp_path):
    """The test file, beside a copy of the rules with one alert's expression broken: promtool must
    report that alert, and only it, as failing."""
    before, after = BROKEN[alert]
    rules = ALERT_RULES.read_text()
    assert rules.count(before) == 1, f"{before!r} should occur once in {ALERT_RULES}"
    (tmp_path / "deploy" / "alerts").mkdir(parents=True)
    (tmp_path / "deploy" / "alerts" / ALERT_RULES.name).write_text(rules.replace(before, after))
    (tmp_path / "tests" / "alerts").mkdir(parents=True)
    shutil.copy(RULE_TESTS, tmp_path / "tests" / "alerts" / RULE_TESTS.name)
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path / "tests" / "alerts")
    failing = {line.split("alertname: ")[1].split(",")[0] for line in (tested.stdout + tested.stderr).splitlines()
               if "alertname: " in line}
    assert tested.returncode != 0 and failing == {alert}, tested.stdout + tested.stderr


def test_the_prometheus_rule_carries_the_rules_files_groups():
    assert PROMETHEUS_RULE.read_text() == prometheus_rule(ALERT_RULES.read_text()), "run `make manifests`"
    manifest = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert (manifest["apiVersion"], manifest["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert manifest["spec"] == yaml.safe_load(ALERT_RULES.read_text())


def test_every_alert_names_metrics_the_router_exports():
    """Each expression reads only series the service exports (under Ray's prefix and suffixes)."""
    import re

    source = REPOSITORY.joinpath("router", "metrics.py").read_text()
    exported = set(re.findall(r'"(specserve_[a-z_]+)"', source))
    rules = yaml.safe_load(ALERT_RULES.read_text())["groups"][0]["rules"]
    assert {rule["alert"] for rule in rules} == set(BROKEN)
    for rule in rules:
        for series in re.findall(r"\bray_(specserve_[a-z_]+)", rule["expr"]):
            base = re.sub(r"_(total|bucket|sum|count)$", "", series)
            assert base in exported, f"{rule['alert']} reads ray_{series}, which the router does not export"


def test_the_shift_bench_scales_every_window_and_for_and_keeps_the_rest(tmp_path):
    """bench/shift.py evaluates these rules on a clock 120 times faster: the same expressions, every
    range and ``for`` divided."""
    from specserve.bench.prometheus import scaled_rules

    shipped = yaml.safe_load(ALERT_RULES.read_text())["groups"][0]["rules"]
    scaled = yaml.safe_load(scaled_rules(ALERT_RULES, tmp_path / "rules.yaml", 120).read_text())["groups"][0]["rules"]
    below = next(r for r in scaled if r["alert"] == "SpecServeAcceptanceBelowBaseline")
    assert "[180s]" in below["expr"] and "[6h]" not in below["expr"] and below["for"] == "8s"
    assert [r["alert"] for r in scaled] == [r["alert"] for r in shipped]
    assert all(r["annotations"] == s["annotations"] and r["labels"] == s["labels"] for r, s in zip(scaled, shipped))
