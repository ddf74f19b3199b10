"""deploy/prometheus: the config and rule files pass ``promtool check``, and the alert rules' unit
tests (deploy/prometheus/tests/alerts_test.yml: each alert fires past its threshold, stays silent
under it) pass ``promtool test rules``. Skipped, with the reason, where Debian's ``prometheus``
package (which ships promtool) is not installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PROM = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
promtool = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    promtool is None, reason="promtool not installed (apt-get install prometheus)"
)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, *args], cwd=PROM, capture_output=True, text=True, timeout=120)


def test_rules_and_config_pass_promtool_check():
    r = _run("check", "rules", "rules/recording.yml", "rules/alerts.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run("check", "config", "prometheus.yml")
    assert r.returncode == 0, r.stdout + r.stderr


def test_alert_rule_unit_tests_pass():
    r = _run("test", "rules", "tests/alerts_test.yml")
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_every_alert_has_a_unit_test():
    import yaml

    alerts = {
        rule["alert"]
        for g in yaml.safe_load((PROM / "rules" / "alerts.yml").read_text())["groups"]
        for rule in g["rules"]
    }
    tests = yaml.safe_load((PROM / "tests" / "alerts_test.yml").read_text())["tests"]
    fired = {t["alertname"] for case in tests for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
    assert alerts == fired
