"""The shipped configurations hold against a hostile client as they are (issue 23, item 9).

A client that a gateway trusts to name itself (``real_ip.from``) picks its own rate-limit key and
skips the per-address connection cap, so no shipped file trusts anything wider than loopback.
The single-node file listens on loopback only; the real_ip examples are commented, name single
addresses, and say the risk.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import pytest

from gateway.plan import load_config
from tests.support.paths import ROOT

SHIPPED = sorted((ROOT / "conf").glob("*.yaml"))
LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))


def test_the_shipped_files_are_all_here() -> None:
    assert {p.name for p in SHIPPED} >= {"limits.yaml", "cluster.yaml", "container.yaml"}


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_no_shipped_file_trusts_forwarding_headers_beyond_loopback(path: Path) -> None:
    trusted = load_config(str(path)).realip.trusted.networks
    wider = [
        str(n) for n in trusted if not any(n.version == lo.version and n.subnet_of(lo) for lo in LOOPBACK)  # type: ignore[arg-type]
    ]
    assert not wider, f"{path.name} trusts forwarding headers from {wider}"


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_commented_real_ip_examples_name_single_addresses(path: Path) -> None:
    text = path.read_text()
    examples = [line for line in text.splitlines() if re.match(r"\s*#.*\b(real_ip|from):", line)]
    networks = [ipaddress.ip_network(n) for line in examples for n in re.findall(r"\b\d+\.\d+\.\d+\.\d+/\d+\b", line)]
    assert all(n.num_addresses == 1 for n in networks), f"{path.name}: an example trusts a range: {networks}"


def test_the_single_node_file_listens_on_loopback_and_says_the_risk_of_real_ip() -> None:
    text = (ROOT / "conf" / "limits.yaml").read_text()
    listen = re.search(r"^listen:\s*(\S+)", text, re.M)
    assert listen is not None and ipaddress.ip_address(listen.group(1).rsplit(":", 1)[0]).is_loopback
    assert re.search(r"^# Risk: .*choose its own rate-limit key", text, re.M)
    assert not re.search(r"^real_ip:", text, re.M), "real_ip must stay commented in the shipped file"
