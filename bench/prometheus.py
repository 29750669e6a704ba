"""A real Prometheus scraping a local cluster's metrics port, for the benches and tests that read what
an operator's would: `make test-slow` and `make shift` fetch Debian's package into .venv/prometheus
and put it on PATH."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

START_SECONDS = 60.0  # until it answers and its target is up


class Prometheus:
    """One Prometheus process scraping ``127.0.0.1:metrics_port`` every ``interval`` seconds and
    evaluating ``rules`` (rule files) as often, its data under ``work``. A context manager."""

    def __init__(self, work: Path, metrics_port: int, port: int, interval: float = 1.0,
                 rules: tuple[Path, ...] = ()) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("no prometheus on PATH: `make test-slow` (or `make shift`) fetches Debian's package "
                               "into .venv/prometheus and puts it on PATH")
        work.mkdir(parents=True, exist_ok=True)
        config = work / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": f"{interval:g}s", "evaluation_interval": f"{interval:g}s"},
            "rule_files": [str(r) for r in rules],
            "scrape_configs": [{"job_name": "specserve",
                                "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}],
        }))
        self.port, self.log = port, work / "prometheus.log"
        with self.log.open("w") as out:
            self.process = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={work / 'data'}",
                                             f"--web.listen-address=127.0.0.1:{port}"],
                                            stdout=out, stderr=subprocess.STDOUT)

    def __enter__(self) -> Prometheus:
        try:
            deadline = time.monotonic() + START_SECONDS
            while not self.scraping():
                if self.process.poll() is not None:
                    raise RuntimeError(f"prometheus exited {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"prometheus never scraped its target:\n{self.log.read_text()[-3000:]}")
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def api(self, path: str, **params: str) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)

    def scraping(self) -> bool:
        """Whether it is up and its one target too."""
        try:
            targets = self.api("targets")["data"]["activeTargets"]
        except OSError:  # not listening yet
            return False
        return bool(targets) and all(target["health"] == "up" for target in targets)

    def alerts(self) -> list[dict]:
        """The alerts pending or firing now, each with its labels, state and activeAt."""
        return self.api("alerts")["data"]["alerts"]


DURATION = re.compile(r"\b(\d+)(ms|s|m|h|d)\b")
SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def scaled_rules(source: Path, out: Path, scale: float) -> Path:
    """A copy of a rules file with every duration (``for:`` and range windows) divided by ``scale``:
    the same expressions on a clock ``scale`` times faster, for a run of minutes. Written to ``out``."""
    def shorter(match: re.Match) -> str:
        seconds = int(match.group(1)) * SECONDS[match.group(2)] / scale
        return f"{max(1, round(seconds))}s"

    doc = yaml.safe_load(source.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule["expr"] = re.sub(r"\[([^\]]+)\]", lambda m: "[" + DURATION.sub(shorter, m.group(1)) + "]", rule["expr"])
            if "for" in rule:
                rule["for"] = DURATION.sub(shorter, str(rule["for"]))
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out
