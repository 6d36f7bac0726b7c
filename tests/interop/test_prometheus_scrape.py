"""A real Prometheus server scrapes the gateway with the example of docs/metrics.md.

The page's ``prometheus.yml`` is used as written, with only its targets pointed at a gateway
started here (``metrics.listen`` for the remote job, the admin API for the job with a token
file) and a 1 s scrape interval; the token file is made as the page says (``gateway token
--show``). Prometheus (Debian's package; scripts/test installs it) must then report both
jobs up and hold the gateway's request counter.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.gateway import cli
from tests.support.ports import free_port, wait_port
from tests.support.upstreams import Upstream

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def doc_prometheus_yml() -> dict[str, Any]:
    """The ``# prometheus.yml`` block of docs/metrics.md."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    found = [b for b in blocks if b.startswith("# prometheus.yml")]
    assert len(found) == 1, "docs/metrics.md must show one prometheus.yml"
    return dict(yaml.safe_load(found[0]))


def config(upstream: Upstream, admin: int, metrics: int) -> object:
    def build(port: int) -> str:
        return f"""
listen: 127.0.0.1:{port}
admin: {{listen: 127.0.0.1:{admin}}}
metrics: {{listen: 127.0.0.1:{metrics}}}
upstreams:
  app: {{servers: [{upstream.address}]}}
routes:
  - {{location: /, upstream: app}}
"""

    return build


def query(port: int, promql: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


async def test_prometheus_scrapes_the_documented_config(gateway_factory, upstream, tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (scripts/test installs Debian's prometheus)")
    admin, metrics, web = free_port(), free_port(), free_port()
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    gw = gateway_factory(config(upstream, admin, metrics), env=env)
    wait_port(admin)
    wait_port(metrics)
    for _ in range(3):
        urllib.request.urlopen(gw.url + "/hello", timeout=5).read()

    scrape = doc_prometheus_yml()
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    remote = next(job for job in jobs.values() if "authorization" not in job)
    local = next(job for job in jobs.values() if "authorization" in job)
    assert all(t.endswith(":9145") for t in remote["static_configs"][0]["targets"])  # metrics.listen's port
    assert local["static_configs"][0]["targets"] == ["127.0.0.1:9180"]  # the admin API, on loopback
    remote["static_configs"][0]["targets"] = [f"127.0.0.1:{metrics}"]
    local["static_configs"][0]["targets"] = [f"127.0.0.1:{admin}"]
    shown = cli("token", "--show", "-c", str(gw.config_path), env=env, timeout=20)  # as the page says
    assert shown.returncode == 0, shown.stderr
    credentials = tmp_path / "gateway-admin-token"
    credentials.write_text(shown.stdout)
    credentials.chmod(0o600)
    local["authorization"]["credentials_file"] = str(credentials)
    scrape["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}
    conf = tmp_path / "prometheus.yml"
    conf.write_text(yaml.safe_dump(scrape))

    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={conf}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{web}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_port(web, timeout=30, proc=proc)
        names = {remote["job_name"], local["job_name"]}
        deadline = time.monotonic() + 45
        while True:
            try:
                up = {r["metric"]["job"]: r["value"][1] for r in query(web, "up")}
                counted = query(web, 'sum by (job) (gateway_requests_total{status="200"})')
            except urllib.error.HTTPError as exc:  # 503 while its storage starts: not ready yet
                if exc.code != 503:
                    raise
                up, counted = {}, []
            if all(up.get(job) == "1" for job in names) and {r["metric"]["job"] for r in counted} == names:
                break
            assert time.monotonic() < deadline, (up, counted, (tmp_path / "prometheus.log").read_text()[-3000:])
            await asyncio.sleep(0.5)
        assert all(float(r["value"][1]) >= 3 for r in counted), counted
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/targets", timeout=5).read())
        assert all(t["health"] == "up" and not t["lastError"] for t in targets["data"]["activeTargets"]), targets
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
