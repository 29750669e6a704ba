"""The KubeRay manifest kept in step with the Serve config: `python -m specserve.cluster.kuberay`.

deploy/kuberay/rayservice.yaml is written by hand except its serveConfigV2, which is
deploy/serve_config.yaml (the file `specserve serve` deploys) copied in verbatim: one source of
truth, and a test fails while the two differ. Given the RayService CRD (``--crd``), the same
command extracts its v1 openAPIV3Schema into deploy/kuberay/rayservice.schema.json, which the tests
validate the manifest against without anything outside the repository. It also writes
deploy/kuberay/prometheusrule.yaml, the Prometheus Operator's form of the alert rules in
deploy/alerts/specserve-rules.yaml (their groups copied in verbatim, comments and all).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .config import DEFAULT_CONFIG_FILE as SERVE_CONFIG

DEPLOY = SERVE_CONFIG.parent
RAYSERVICE = DEPLOY / "kuberay" / "rayservice.yaml"
RAYSERVICE_SCHEMA = DEPLOY / "kuberay" / "rayservice.schema.json"
SERVE_CONFIG_KEY = "serveConfigV2: |"
ALERT_RULES = DEPLOY / "alerts" / "specserve-rules.yaml"
PROMETHEUS_RULE = DEPLOY / "kuberay" / "prometheusrule.yaml"
PROMETHEUS_RULE_HEAD = """\
# Prometheus Operator: specserve's alert rules. Written by `make manifests` from
# deploy/alerts/specserve-rules.yaml (edit that file, not this one; a test fails while they differ).
# Label it as your Prometheus' ruleSelector wants.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: specserve
  labels:
    app.kubernetes.io/name: specserve
spec:
"""
CRD_VERSION = "v1"


def embed_serve_config(manifest: str, serve_config: str) -> str:
    """``manifest`` with the literal block under ``serveConfigV2: |`` replaced by ``serve_config``.

    Text, not a YAML round trip, so the hand-written rest of the manifest keeps its comments and
    layout; the block is indented two spaces deeper than its key, as YAML's literal style wants.
    """
    lines = manifest.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.strip() == SERVE_CONFIG_KEY]
    if len(starts) != 1:
        raise ValueError(f"the manifest must have exactly one line `{SERVE_CONFIG_KEY}`, found {len(starts)}")
    key = starts[0]
    indent = " " * (len(lines[key]) - len(lines[key].lstrip()) + 2)
    end = key + 1
    while end < len(lines) and (lines[end].startswith(indent) or not lines[end].strip()):
        end += 1
    while end > key + 1 and not lines[end - 1].strip():  # blank lines after the block stay outside it
        end -= 1
    block = [indent + line if line.strip() else "\n" for line in serve_config.splitlines(keepends=True)]
    return "".join(lines[: key + 1] + block + lines[end:])


def prometheus_rule(rules: str) -> str:
    """The PrometheusRule of a plain rules file: its groups (from the line ``groups:`` on, its
    comments kept) under ``spec``."""
    lines = rules.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.rstrip() == "groups:"]
    if len(starts) != 1:
        raise ValueError(f"the rules file must have exactly one top-level line `groups:`, found {len(starts)}")
    return PROMETHEUS_RULE_HEAD + "".join("  " + line if line.strip() else "\n" for line in lines[starts[0]:])


def crd_schema(crd: dict, version: str = CRD_VERSION) -> dict:
    """The openAPIV3Schema of one served version of a CustomResourceDefinition."""
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            return entry["schema"]["openAPIV3Schema"]
    raise ValueError(f"the CRD has no version {version!r}")


def unknown_fields(document, schema: dict, path: str = "") -> list[str]:
    """Fields the schema does not define, as the API server's strict field validation (kubectl's
    default) would refuse them; plain JSON Schema lets them through, since CRD schemas do not say
    ``additionalProperties: false``."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found = []
    if isinstance(document, dict) and "properties" in schema:
        for name, value in document.items():
            if name in schema["properties"]:
                found += unknown_fields(value, schema["properties"][name], f"{path}.{name}")
            elif path or name not in ("apiVersion", "kind", "metadata"):
                found.append(f"{path}.{name}".lstrip("."))
    elif isinstance(document, dict) and isinstance(schema.get("additionalProperties"), dict):
        for name, value in document.items():
            found += unknown_fields(value, schema["additionalProperties"], f"{path}.{name}")
    elif isinstance(document, list) and "items" in schema:
        for i, item in enumerate(document):
            found += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return found


def manifest_problems(manifest: dict, schema: dict) -> list[str]:
    """What the API server would refuse in ``manifest``: schema violations and undefined fields."""
    import jsonschema

    problems = [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                for e in jsonschema.Draft7Validator(schema).iter_errors(manifest)]
    return problems + [f"{path}: not a field of the RayService" for path in unknown_fields(manifest, schema)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specserve.cluster.kuberay", description=(
        "Copy deploy/serve_config.yaml into the RayService manifest's serveConfigV2 and check the "
        "manifest against the RayService CRD's schema (with --crd, first extract that schema from the CRD); "
        "write the alert rules' PrometheusRule from deploy/alerts/specserve-rules.yaml."))
    parser.add_argument("--crd", type=Path, help="the RayService CRD (ray.io_rayservices.yaml from KubeRay)")
    args = parser.parse_args(argv)
    manifest = RAYSERVICE.read_text()
    synced = embed_serve_config(manifest, SERVE_CONFIG.read_text())
    RAYSERVICE.write_text(synced)
    print(f"{RAYSERVICE}: serveConfigV2 {'updated' if synced != manifest else 'already in step'}")
    rule = prometheus_rule(ALERT_RULES.read_text())
    if not PROMETHEUS_RULE.exists() or PROMETHEUS_RULE.read_text() != rule:
        PROMETHEUS_RULE.write_text(rule)
        print(f"{PROMETHEUS_RULE}: updated from {ALERT_RULES}")
    import yaml

    if args.crd:
        schema = crd_schema(yaml.safe_load(args.crd.read_text()))
        RAYSERVICE_SCHEMA.write_text(json.dumps(schema, sort_keys=True, separators=(",", ":")) + "\n")
        print(f"{RAYSERVICE_SCHEMA}: the {CRD_VERSION} schema of {args.crd}")
    problems = manifest_problems(yaml.safe_load(synced), json.loads(RAYSERVICE_SCHEMA.read_text()))
    for problem in problems:
        print(f"{RAYSERVICE}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
