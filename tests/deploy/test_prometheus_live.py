"""A real Prometheus (Debian's ``prometheus``) scrapes a live ``longmoe serve`` with the repository's
scrape config and rules (targets swapped for the test's replica, 1 s intervals): the target comes
up, both rule groups load healthy, and a histogram quantile of time to first token over the requests
the test sent comes back as a number within the range the server's own buckets allow."""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.helpers.serve_proc import free_port, serve_process

PROM = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
prometheus = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    prometheus is None, reason="prometheus not installed (apt-get install prometheus)"
)
WAIT_S = 90


def _config(tmp: Path, target: str) -> Path:
    cfg = yaml.safe_load((PROM / "prometheus.yml").read_text())
    cfg["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    cfg["rule_files"] = [str(PROM / f) for f in cfg["rule_files"]]
    cfg["scrape_configs"][0]["static_configs"] = [{"targets": [target]}]
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _query(api: str, q: str) -> list:
    r = httpx.get(api + "/api/v1/query", params={"query": q}, timeout=10).json()
    assert r["status"] == "success", r
    return r["data"]["result"]


def _until(what: str, fn, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = fn()
            if got:
                return got
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)


@pytest.mark.slow(wall="not measured (a live Prometheus beside longmoe serve)")
def test_prometheus_scrapes_a_live_server_and_answers_a_ttft_quantile(model_dir, tmp_path):
    with serve_process(model_dir, "--model-name", "m") as sp:
        port = free_port()
        cmd = [
            prometheus, f"--config.file={_config(tmp_path, f'127.0.0.1:{sp.port}')}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
        ]  # fmt: skip
        log = (tmp_path / "prometheus.log").open("wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        api = f"http://127.0.0.1:{port}"
        try:
            _until("prometheus ready", lambda: httpx.get(api + "/-/ready", timeout=5).status_code == 200)
            _until("target up", lambda: _query(api, 'up{job="longmoe"} == 1'))
            body = {"model": "m", "prompt": "hello", "max_tokens": 4, "ignore_eos": True}
            for _ in range(6):
                assert httpx.post(sp.url + "/v1/completions", json=body, timeout=60).status_code == 200
            q = "histogram_quantile(0.5, sum by (le) (rate(longmoe_time_to_first_token_seconds_bucket[30s])))"
            res = _until(
                "a TTFT quantile", lambda: [x for x in _query(api, q) if math.isfinite(float(x["value"][1]))]
            )
            p50 = float(res[0]["value"][1])
            assert 0 < p50 <= 320  # inside the buckets' range (serve/api/metrics.py TTFT_BUCKETS)
            count = _query(api, 'longmoe_time_to_first_token_seconds_count{model_name="m"}')
            assert float(count[0]["value"][1]) >= 6
            rules = httpx.get(api + "/api/v1/rules", timeout=10).json()["data"]["groups"]
            assert {g["name"] for g in rules} == {"longmoe.recording", "longmoe.alerts"}
            assert all(r["health"] == "ok" for g in rules for r in g["rules"]), rules
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()
