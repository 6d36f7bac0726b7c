"""One nginx and one gateway host every scenario; one replay runs them all in parallel.

The session fixture ``differential`` returns, per scenario name, the ``Comparison`` of both
targets with each other and with the model (plus both error logs); each test then only reads
its scenario's verdict. The full per-request table is written to <tmp>/differential0/report.txt.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.differential import harness
from tests.support.differential.scenarios import ALL
from tests.support.gateway import Gateway
from tests.support.nginx import find_nginx
from tests.support.ports import free_port
from tests.support.upstreams import Upstream


@pytest.fixture(scope="session")
def differential(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Run]:
    binary = find_nginx()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("the nginx binary is required for the differential tests when CI is set")
        pytest.skip("nginx binary not found (differential tests need it)")
    workdir: Path = tmp_path_factory.mktemp("differential")
    scenarios = [dataclasses.replace(s, start_offset_ms=k * harness.STAGGER_MS) for k, s in enumerate(ALL)]
    jitter = harness.default_jitter()

    upstream = Upstream("diff").start()
    upstream.hooks["echo"] = harness.hold_request
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
        yield harness.run_and_compare(nginx, gateway, scenarios, jitter, workdir)
    finally:
        gateway.stop()
        nginx.stop()
        upstream.stop()
