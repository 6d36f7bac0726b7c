"""One nginx and one gateway host every scenario; one replay runs them all in parallel.

The session fixture ``differential`` returns, per scenario name, the ``Comparison`` of both
targets with each other and with the model (plus both error logs); each test then only reads
its scenario's verdict. The full per-request table is written to <tmp>/differential0/report.txt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.differential import harness
from tests.differential.model import analyse
from tests.differential.scenario import Scenario
from tests.differential.scenarios import ALL
from tests.helpers import Gateway, Upstream, free_port

STAGGER_MS = 30  # scenario k starts k * 30 ms after the common start: bursts do not coincide


def find_nginx() -> str | None:
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


async def _hold(request: web.Request) -> None:
    """Upstream hook: ``?hold=MS`` keeps the request (and its limit_conn slot) for MS ms."""
    ms = int(request.query.get("hold", "0") or 0)
    if ms:
        await asyncio.sleep(ms / 1000)


def run_and_compare(
    nginx: harness.Nginx, gateway: Gateway, scenarios: list[Scenario], jitter: int, workdir: Path
) -> harness.Run:
    """Start both, run every scenario through each, and compare them request for request."""
    nginx.start()
    gateway.start()
    observed, base, loop_lag = asyncio.run(harness.run_all(scenarios, nginx.url, gateway.url))
    harness.wait_for_logs()
    overhead = {name: harness.overhead_from(samples) for name, samples in base.items()}
    by_rid: dict[str, dict[str, harness.Observed]] = {"nginx": {}, "gateway": {}}
    for scn in scenarios:
        for target in ("nginx", "gateway"):
            for i, obs in enumerate(observed[scn.name][target]):
                by_rid[target][harness.rid(scn, i)] = obs
    harness.attach_logs(by_rid["nginx"], nginx.access(), nginx.errors())
    harness.attach_logs(by_rid["gateway"], gateway.access_json(wait=0), gateway.stderr())
    results = {}
    for scn in scenarios:
        both = observed[scn.name]["nginx"] + observed[scn.name]["gateway"]
        lateness = max(0, math.ceil(max(o.lateness_ms for o in both)))
        analysis = analyse(scn, (scn.jitter_ms or jitter) + lateness)
        results[scn.name] = harness.compare(
            scn, analysis, observed[scn.name]["nginx"], observed[scn.name]["gateway"], overhead, loop_lag
        )
    report = "\n\n".join(c.report() for c in results.values())
    (workdir / "report.txt").write_text(report + "\n")
    return harness.Run(results, nginx.errors(), gateway.stderr(), workdir)


@pytest.fixture(scope="session")
def differential(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Run]:
    binary = find_nginx()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("the nginx binary is required for the differential tests when CI is set")
        pytest.skip("nginx binary not found (differential tests need it)")
    workdir: Path = tmp_path_factory.mktemp("differential")
    scenarios = [dataclasses.replace(s, start_offset_ms=k * STAGGER_MS) for k, s in enumerate(ALL)]
    jitter = harness.default_jitter()

    upstream = Upstream("diff").start()
    upstream.hooks["echo"] = _hold
    nginx_dir = workdir / "nginx"
    nginx_dir.mkdir()
    gateway_dir = workdir / "gateway"
    gateway_dir.mkdir()
    nginx_port, gateway_port = free_port(), free_port()
    nginx = harness.Nginx(
        binary, nginx_dir, harness.nginx_conf(nginx_dir, nginx_port, upstream.address, scenarios), nginx_port
    )
    gateway = Gateway(gateway_dir, harness.gateway_yaml(gateway_port, upstream.address, scenarios), gateway_port)
    try:
        yield run_and_compare(nginx, gateway, scenarios, jitter, workdir)
    finally:
        gateway.stop()
        nginx.stop()
        upstream.stop()
