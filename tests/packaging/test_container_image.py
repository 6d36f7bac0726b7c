"""The container image, built from the repo's Dockerfile and run for real with Podman.

* The base image (debian:bookworm-slim) is made locally with debootstrap when Podman does
  not have it (no registry is reachable on these machines), and reused on later runs.
* The image is built exactly from ./Dockerfile (``--format docker`` keeps the HEALTHCHECK;
  the host's CA bundle is mounted into the build for pip behind a TLS-intercepting proxy).
* The one-line case: the shipped config, GATEWAY_UPSTREAM, a published port.
* A cluster: two gateway containers (host network, each with its own config mounted over
  /etc/gateway/limits.yaml, made from conf/cluster.yaml) sharing one redis-server and one
  upstream: a proxied request, a shared limit, a ban through one node holding on the other,
  HEALTHCHECK healthy, a non-root PID 1, and `podman stop` draining a slow request.

* compose.yaml, run with podman-compose: the same two nodes on a compose network, with
  Redis (a local stand-in for the redis image when no registry is reachable) and the demo
  upstream.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import resource
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.ports import free_port
from tests.support.redis_procs import RedisServer
from tests.support.upstreams import Upstream

pytestmark = pytest.mark.redis  # Redis processes of its own (slow: from tests/conftest.py)

PODMAN = ["podman", "--runtime", "runc"]  # the default crun fails on some cgroup setups; runc works
BASE_IMAGE = "docker.io/library/debian:bookworm-slim"
IMAGE = "localhost/gateway:latest"  # the name compose.yaml uses
REDIS_IMAGE = "docker.io/library/redis:7-bookworm"  # compose.yaml's Redis
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
TOKEN_DIR = "/run/gateway/gateway"  # $XDG_RUNTIME_DIR/gateway in the image
GATEWAY_UID = "10001"


def sh(cmd: list[str], *, timeout: float, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def podman(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    return sh([*PODMAN, *args], timeout=timeout, check=check)


def ulimit_args() -> list[str]:
    """Podman's default rlimits can exceed what this process may set (runc then fails with
    "error setting rlimit type 6/7"): ask for what we have."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    nofile = 65536 if soft == resource.RLIM_INFINITY else soft
    nproc_soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    nproc = 4096 if nproc_soft == resource.RLIM_INFINITY else min(nproc_soft, 4096)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


def debian_mirror() -> str:
    """The Debian mirror apt uses on this machine (deb822 .sources or a sources.list line)."""
    files = sorted(Path("/etc/apt/sources.list.d").glob("*.sources")) + [Path("/etc/apt/sources.list")]
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        for stanza in text.split("\n\n"):
            if re.search(r"^Suites:.*\bbookworm\b(?!-)", stanza, re.M):
                match = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
                if match and not match.group(1).rstrip("/").endswith("-security"):
                    return match.group(1)
        match = re.search(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+bookworm\s", text, re.M)
        if match:
            return match.group(1)
    return "http://deb.debian.org/debian"


def have_image(name: str) -> bool:
    """In local storage, or pulled from its registry when one is reachable."""
    if podman("image", "exists", name, check=False).returncode == 0:
        return True
    return podman("pull", "-q", name, check=False, timeout=300).returncode == 0


def ensure_base_image(workdir: Path) -> None:
    if have_image(BASE_IMAGE):
        return
    if shutil.which("debootstrap") is None:
        pytest.skip(f"{BASE_IMAGE} cannot be pulled and debootstrap (apt-get install debootstrap) is not installed")
    rootfs = workdir / "rootfs"
    try:
        sh(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), debian_mirror()], timeout=900)
        with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:
            sh([*PODMAN, "import", "-", BASE_IMAGE], stdin=tar.stdout, timeout=300)
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    missing = [tool for tool in ("podman", "runc") if shutil.which(tool) is None]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed (scripts/test installs them with apt: apt-get install podman runc debootstrap)"
        )
    started = time.monotonic()
    ensure_base_image(tmp_path_factory.mktemp("base"))
    based = time.monotonic()
    build = [*PODMAN, "build", "--network", "host", "--format", "docker", *ulimit_args()]
    if HOST_CA.is_file():
        build += ["--volume", f"{HOST_CA}:/host-ca.crt:ro", "--build-arg", "PIP_CERT=/host-ca.crt"]
    sh([*build, "-f", str(ROOT / "Dockerfile"), "-t", IMAGE, str(ROOT)], timeout=900)
    print(f"container image: base {based - started:.1f} s, build {time.monotonic() - based:.1f} s")
    return IMAGE


class Container:
    def __init__(self, name: str) -> None:
        self.name = name

    def inspect(self, template: str) -> str:
        return podman("inspect", "--format", template, self.name).stdout.strip()

    def running(self) -> bool:
        return self.inspect("{{.State.Running}}") == "true"

    def logs(self) -> str:
        proc = podman("logs", self.name, check=False)
        return proc.stdout + proc.stderr

    def exec(self, *args: str) -> str:
        return podman("exec", self.name, *args).stdout


@pytest.fixture
def containers() -> Iterator[Any]:
    made: list[Container] = []
    tag = uuid.uuid4().hex[:8]

    def run(role: str, *args: str, command: tuple[str, ...] = ()) -> Container:
        name = f"gwtest-{tag}-{role}"
        podman("run", "-d", "--name", name, *ulimit_args(), *args, IMAGE, *command)
        container = Container(name)
        made.append(container)
        return container

    yield run
    for container in made:
        podman("rm", "-f", "-t", "0", container.name, check=False, timeout=60)


def http_get(port: int, path: str, *, client_ip: str | None = None, timeout: float = 10) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"X-Forwarded-For": client_ip} if client_ip else {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def wait_http(port: int, container: Container, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            http_get(port, "/healthz-probe-not-routed", timeout=2)
            return
        except OSError:
            if not container.running():
                raise AssertionError(f"{container.name} exited:\n{container.logs()}") from None
            time.sleep(0.1)
    raise AssertionError(f"{container.name} did not answer on :{port} in {timeout} s:\n{container.logs()}")


def wait_for(predicate: Any, timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s")


def test_the_one_line_run_proxies_to_gateway_upstream(image: str, containers: Any) -> None:
    """The shipped config and GATEWAY_UPSTREAM, as the README's one-line example: a published port,
    the upstream on the host (here the image's own demo upstream, on the host network)."""
    refused = podman("run", "--rm", *ulimit_args(), image, check=False, timeout=60)
    assert refused.returncode == 1
    assert "set GATEWAY_UPSTREAM=host:port" in refused.stderr, refused.stderr

    demo_port, port = free_port(), free_port()
    demo = containers("demo", "--network", "host", command=("demo-upstream", "--listen", f"0.0.0.0:{demo_port}"))
    gateway = containers(
        "one", "-p", f"127.0.0.1:{port}:8080", "-e", f"GATEWAY_UPSTREAM=host.containers.internal:{demo_port}"
    )
    wait_http(port, gateway)
    assert demo.running()
    status, body = http_get(port, "/hello?x=1")
    assert status == 200, body
    echoed = json.loads(body)
    assert echoed["path"] == "/hello?x=1" and echoed["method"] == "GET"
    assert podman("healthcheck", "run", gateway.name, check=False).returncode == 0
    token = gateway.exec("cat", f"{TOKEN_DIR}/admin-9180.token").strip()
    assert len(token) >= 32, "the generated admin token is readable with podman exec"


def node_config(port: int, admin_port: int, redis_port: int, prefix: str, upstream: str) -> str:
    """conf/cluster.yaml (what compose.yaml mounts), with this host's addresses: both nodes
    share the host's network here, so each gets its own ports."""
    config = yaml.safe_load((ROOT / "conf" / "cluster.yaml").read_text())
    config["listen"] = f"127.0.0.1:{port}"
    config["admin"]["listen"] = f"127.0.0.1:{admin_port}"
    config["store"]["redis"]["url"] = f"redis://127.0.0.1:{redis_port}/0"
    config["store"]["redis"]["prefix"] = prefix
    config["upstreams"]["app"]["servers"] = [upstream]
    # The test is the load balancer: X-Forwarded-For names the client.
    config["real_ip"] = {"from": ["127.0.0.1/32"], "header": "X-Forwarded-For", "recursive": True}
    config["shutdown_timeout"] = "20s"
    return yaml.safe_dump(config)


@pytest.mark.timing
def test_two_containers_share_limits_and_bans_and_drain_on_sigterm(
    image: str, containers: Any, redis_session: RedisServer, upstream: Upstream, tmp_path: Path
) -> None:
    prefix = f"ctr{uuid.uuid4().hex[:6]}:"
    nodes = []
    for role in ("a", "b"):
        port, admin_port = free_port(), free_port()
        config = tmp_path / f"{role}.yaml"
        config.write_text(node_config(port, admin_port, redis_session.port, prefix, upstream.address))
        config.chmod(0o644)
        container = containers(
            role,
            "--network",
            "host",
            "-v",
            f"{config}:/etc/gateway/limits.yaml:ro",
            "-e",
            f"GATEWAY_HEALTHZ=http://127.0.0.1:{admin_port}/healthz",
        )
        nodes.append((container, port, admin_port))
    for container, port, _ in nodes:
        wait_http(port, container)
    (a, a_port, a_admin), (b, b_port, _) = nodes

    # A proxied request, through each node.
    for port in (a_port, b_port):
        status, body = http_get(port, "/echo/hi", client_ip="10.9.0.1")
        assert status == 200, body
    assert [s["path"] for s in upstream.seen[-2:]] == ["/echo/hi", "/echo/hi"]

    # One limit for both nodes: per_ip is 10r/s with burst 20 (nodelay), ban 60 s. Alone, each
    # node would pass 21 of 40; shared, 21 pass plus what leaks during the run, and the first
    # rejection bans the key on both nodes.
    started = time.monotonic()
    statuses = [http_get((a_port, b_port)[i % 2], "/echo/burst", client_ip="10.9.0.2")[0] for i in range(40)]
    elapsed = time.monotonic() - started
    passed = statuses.count(200)
    assert set(statuses) == {200, 429}, statuses
    assert 21 <= passed <= 21 + int(10 * elapsed) + 1, (passed, elapsed, statuses)
    assert passed < 40 - 10, f"the nodes limited alone: {passed} of 40 passed"
    first_reject = statuses.index(429)
    assert all(s == 429 for s in statuses[first_reject:]), f"the ban did not hold on both nodes: {statuses}"

    # A ban through node a's admin API (with the token it wrote in its container) holds on node b.
    token = a.exec("cat", f"{TOKEN_DIR}/admin-{a_admin}.token").strip()
    conn = http.client.HTTPConnection("127.0.0.1", a_admin, timeout=5)
    conn.request(
        "POST",
        "/bans",
        body=json.dumps({"target": "10.9.0.3", "for": "10m", "reason": "container test"}),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    answer = conn.getresponse()
    assert answer.status in (200, 201), answer.read()
    conn.close()
    propagation = wait_for(
        lambda: http_get(b_port, "/echo/x", client_ip="10.9.0.3")[0] == 403, 3, "the ban made on node a, on node b"
    )
    assert http_get(b_port, "/echo/x", client_ip="10.9.0.4")[0] == 200

    # HEALTHCHECK, and the gateway is PID 1 and not root.
    for container, _, _ in nodes:
        assert podman("healthcheck", "run", container.name, check=False).returncode == 0, container.logs()
        assert container.inspect("{{.State.Health.Status}}") == "healthy"
        status_lines = dict(
            line.split(":", 1) for line in container.exec("cat", "/proc/1/status").splitlines() if ":" in line
        )
        assert status_lines["Uid"].split() == [GATEWAY_UID] * 4, status_lines["Uid"]
        assert "gateway\x00run" in container.exec("cat", "/proc/1/cmdline")

    # SIGTERM (podman stop) drains a slow request in flight on node b.
    result: dict[str, Any] = {}

    def slow() -> None:
        result["response"] = http_get(b_port, "/slow?ms=2500", client_ip="10.9.0.5", timeout=30)

    before = len(upstream.seen)
    client = threading.Thread(target=slow)
    client.start()
    wait_for(lambda: any(s["path"].startswith("/slow") for s in upstream.seen[before:]), 5, "the slow request upstream")
    stop_started = time.monotonic()
    podman("stop", "-t", "30", b.name, timeout=60)
    stop_took = time.monotonic() - stop_started
    client.join(5)
    assert result.get("response") == (200, b"slow up1"), result
    assert b.inspect("{{.State.ExitCode}}") == "0", b.logs()
    assert 1.0 < stop_took < 20, stop_took
    assert "shutting down gracefully" in b.logs()
    assert http_get(a_port, "/echo/after", client_ip="10.9.0.6")[0] == 200  # the other node serves on
    print(f"ban propagation between containers: {propagation * 1000:.0f} ms; podman stop drained in {stop_took:.1f} s")


def ensure_redis_image(workdir: Path) -> None:
    """compose.yaml's redis image; with no registry, a stand-in built on the same Debian base."""
    if have_image(REDIS_IMAGE):
        return
    (workdir / "Containerfile").write_text(
        f"FROM {BASE_IMAGE}\n"
        "RUN apt-get update && apt-get install -y --no-install-recommends redis-server && rm -rf /var/lib/apt/lists/*\n"
        "USER redis\n"
        'CMD ["redis-server"]\n'
    )
    podman(
        "build", "--network", "host", "--format", "docker", *ulimit_args(), "-t", REDIS_IMAGE, str(workdir), timeout=600
    )


def status_from(container: str, url: str) -> int:
    """GET url from inside a container on the compose network (its own address as the client)."""
    script = (
        "import urllib.error, urllib.request\n"
        "try:\n"
        f"    print(urllib.request.urlopen({url!r}, timeout=5).status)\n"
        "except urllib.error.HTTPError as exc:\n"
        "    print(exc.code)\n"
    )
    return int(podman("exec", container, "python3", "-c", script).stdout.strip())


@pytest.mark.timing
def test_compose_runs_two_nodes_sharing_limits_and_bans(image: str, tmp_path: Path) -> None:
    if shutil.which("podman-compose") is None:
        pytest.skip("podman-compose not installed (scripts/test installs it with apt: apt-get install podman-compose)")
    ensure_redis_image(tmp_path)
    conf = tmp_path / "containers.conf"  # what the PODMAN flags say, for the podman that podman-compose runs
    ulimits = ulimit_args()[1::2]
    conf.write_text(f'[containers]\ndefault_ulimits = {json.dumps(ulimits)}\n[engine]\nruntime = "{PODMAN[2]}"\n')
    port1, port2 = free_port(), free_port()
    env = dict(os.environ, CONTAINERS_CONF=str(conf), GATEWAY1_PORT=str(port1), GATEWAY2_PORT=str(port2))
    project = f"gwtest{uuid.uuid4().hex[:8]}"
    compose = ["podman-compose", "-p", project, "-f", str(ROOT / "compose.yaml")]
    gateway1, gateway2 = Container(f"{project}_gateway1_1"), Container(f"{project}_gateway2_1")
    demo = f"{project}_demo_1"
    try:
        sh([*compose, "up", "-d", "--no-build"], env=env, cwd=ROOT, timeout=300)
        wait_http(port1, gateway1)
        wait_http(port2, gateway2)

        # Proxied to the demo upstream, through each node.
        for port in (port1, port2):
            status, body = http_get(port, "/compose")
            assert status == 200, body
            assert json.loads(body)["path"] == "/compose"

        # A ban made with node 1's CLI (through Redis) holds on node 2, for a client inside the network.
        assert status_from(demo, "http://gateway2:8080/") == 200
        demo_ip = podman("inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", demo)
        gateway1.exec("gateway", "ban", demo_ip.stdout.strip(), "--for", "10m", "--reason", "compose test")
        wait_for(lambda: status_from(demo, "http://gateway2:8080/") == 403, 3, "node 1's ban, on node 2")
        listed = json.loads(gateway2.exec("gateway", "bans", "--json"))
        assert [b.get("reason") for b in listed] == ["compose test"], listed

        for node in (gateway1, gateway2):
            assert podman("healthcheck", "run", node.name, check=False).returncode == 0, node.logs()

        # One limit for both nodes (every request through a published port comes from the same address).
        started = time.monotonic()
        statuses = [http_get((port1, port2)[i % 2], "/compose")[0] for i in range(40)]
        elapsed = time.monotonic() - started
        passed = statuses.count(200)
        assert set(statuses) == {200, 429}, statuses
        assert 21 <= passed <= 21 + int(10 * elapsed) + 1, (passed, elapsed, statuses)
    finally:
        sh([*compose, "down", "-t", "0"], env=env, cwd=ROOT, timeout=180, check=False)
        podman("network", "rm", "-f", f"{project}_default", check=False)
