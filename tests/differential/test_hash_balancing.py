"""``ip_hash``, ``hash $key`` and ``hash $key consistent`` against the nginx binary: the same key
(or client address) must land on the same server in nginx and in ``gateway.proxy.hashing``.

One nginx process serves both sides: backend server blocks that answer their own name (on TCP
ports, and one on a unix socket), and front server blocks whose upstreams balance over them.
The gateway, started through its CLI, balances over the same backends with the same server list
(the unix socket included: the consistent ring places it by its path): its picks are compared
with nginx's request for request.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.proxy.hashing import ConsistentRing, hash_pick, ip_hash_pick
from tests.support.gateway import Gateway
from tests.support.nginx import NginxProcess, find_nginx, single_worker_conf
from tests.support.ports import free_port

NGINX = find_nginx()
pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

WEIGHTS = [1, 2, 3, 1, 2]
DOWN = [False, False, False, True, False]  # ip_hash and hash keep a down server's slot


class Setup:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.backends = [free_port() for _ in WEIGHTS[:-1]]
        self.sock = workdir / "s4.sock"
        # Server names as written in the upstream blocks: what the consistent ring hashes.
        self.names = [f"127.0.0.1:{p}" for p in self.backends] + [f"unix:{self.sock}"]
        self.fronts = {"hash": free_port(), "chash": free_port(), "ip_hash": free_port()}


def servers(setup: Setup, *, down: bool) -> str:
    lines = []
    for i, (name, weight) in enumerate(zip(setup.names, WEIGHTS, strict=True)):
        flag = " down" if down and DOWN[i] else ""
        lines.append(f"        server {name} weight={weight}{flag};")
    return "\n".join(lines)


def nginx_conf(setup: Setup) -> str:
    backends = "\n".join(
        f"    server {{ listen 127.0.0.1:{port}; return 200 s{i}; }}" for i, port in enumerate(setup.backends)
    )
    return single_worker_conf(
        setup.workdir,
        f"""    access_log off;
{backends}
    server {{ listen unix:{setup.sock}; return 200 s4; }}
    upstream by_hash {{
        hash $arg_k;
{servers(setup, down=True)}
    }}
    upstream by_chash {{
        hash $arg_k consistent;
{servers(setup, down=False)}
    }}
    upstream by_ip {{
        ip_hash;
{servers(setup, down=True)}
    }}
    server {{ listen 127.0.0.1:{setup.fronts["hash"]}; location / {{ proxy_pass http://by_hash; }} }}
    server {{ listen 127.0.0.1:{setup.fronts["chash"]}; location / {{ proxy_pass http://by_chash; }} }}
    server {{ listen 127.0.0.1:{setup.fronts["ip_hash"]}; location / {{ proxy_pass http://by_ip; }} }}""",
    )


@pytest.fixture(scope="module")
def nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    assert NGINX is not None
    workdir = tmp_path_factory.mktemp("hash-balancing")
    setup = Setup(workdir)
    proc = NginxProcess(NGINX, workdir, nginx_conf(setup), setup.fronts["ip_hash"]).start()
    yield setup
    proc.stop()


def served_by(port: int, target: str, source: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.settimeout(5)
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        out = b""
        while data := sock.recv(65536):
            out += data
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), out
    return int(body.decode().strip()[1:])


def keys(n: int) -> list[str]:
    rng = random.Random(24)
    return [f"user{rng.randrange(10**9)}" for _ in range(n)] + ["a", "b", "0", "key-with-dashes", "x" * 200]


def test_hash_key_matches_nginx(nginx: Setup) -> None:
    port = nginx.fronts["hash"]
    for key in keys(150):
        expected = hash_pick(key.encode(), WEIGHTS, lambda i: not DOWN[i])
        assert served_by(port, f"/?k={key}") == expected, key


def test_consistent_hash_matches_nginx(nginx: Setup) -> None:
    port = nginx.fronts["chash"]
    ring = ConsistentRing(list(zip(nginx.names, WEIGHTS, strict=True)))
    spread = set()
    for key in keys(150):
        expected = ring.pick(key.encode(), lambda i: True)
        spread.add(expected)
        assert served_by(port, f"/?k={key}") == expected, key
    assert len(spread) == len(WEIGHTS)


def test_ip_hash_matches_nginx(nginx: Setup) -> None:
    port = nginx.fronts["ip_hash"]
    rng = random.Random(7)
    sources = [f"127.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}" for _ in range(80)]
    for source in sources:
        packed = socket.inet_aton(source)
        expected = ip_hash_pick(packed, WEIGHTS, lambda i: not DOWN[i])
        assert served_by(port, "/", source) == expected, source


def gateway_yaml(setup: Setup, port: int) -> str:
    def servers(down: bool) -> str:
        return ", ".join(
            f"{{address: '{name}', weight: {weight}, down: {str(down and DOWN[i]).lower()}}}"
            for i, (name, weight) in enumerate(zip(setup.names, WEIGHTS, strict=True))
        )

    return f"""
listen: 127.0.0.1:{port}
upstreams:
  by_hash: {{servers: [{servers(True)}], balance: "hash $arg_k"}}
  by_chash: {{servers: [{servers(False)}], balance: "hash $arg_k consistent"}}
routes:
  - {{location: /h, upstream: by_hash}}
  - {{location: /c, upstream: by_chash}}
"""


@pytest.fixture(scope="module")
def gateway(nginx: Setup, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    workdir = tmp_path_factory.mktemp("hash-balancing-gateway")
    port = free_port()
    gw = Gateway(workdir, gateway_yaml(nginx, port), port).start()
    yield gw
    gw.stop()


@pytest.mark.parametrize(("front", "path"), [("hash", "/h"), ("chash", "/c")])
def test_the_gateway_picks_the_server_nginx_picks(nginx: Setup, gateway: Gateway, front: str, path: str) -> None:
    picked = set()
    for key in keys(60):
        index = served_by(gateway.port, f"{path}?k={key}")
        assert index == served_by(nginx.fronts[front], f"/?k={key}"), key
        picked.add(index)
    assert len(WEIGHTS) - 1 in picked  # the unix-socket server is among them
