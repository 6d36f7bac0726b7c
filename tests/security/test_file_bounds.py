"""Every file the configuration names, and every nginx include, is read within a bound (issue 23, item 7).

Each case runs the real CLI in a child process with a timeout, and measures the child's
peak RSS (``RUSAGE_CHILDREN`` of a fresh wrapper process, so earlier children do not count):
a device, a FIFO, a 42 MB blocklist, 200 includes of a 1 MB file and a glob over ``/`` are
each refused in seconds at flat memory, with the file and line that named them, never read
by growing and never blocking. The bounds are tested at their edge too: a blocklist just
under its 16 MiB bound is read.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.bans.blocklist import MAX_BYTES, parse_blocklist
from gateway.files import FileRefused, FileTooLarge, bounded_lines, read_bounded
from gateway.nginxconf.parser import MAX_TOTAL_BYTES
from tests.support.gateway import Gateway, cli
from tests.support.paths import ROOT
from tests.support.ports import free_port
from tests.support.upstreams import Upstream

MB = 1024 * 1024
SMALL_RSS_KB = 150 * 1024  # the CLI at rest is some 45 MB: a refusal stays near it
_MEASURE = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.call(sys.argv[2:])\n"
    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
    "sys.exit(rc)\n"
)


class Run:
    def __init__(self, returncode: int, stdout: str, stderr: str, seconds: float, rss_kb: int) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr
        self.seconds, self.rss_kb = seconds, rss_kb

    def lines(self) -> list[str]:
        return self.stderr.strip().splitlines()


def gateway(*args: str, tmp: Path, timeout: float) -> Run:
    """``gateway ARGS`` in a child: its output, wall time and peak RSS; killed (and failed) past ``timeout``."""
    rss_file = tmp / f"rss-{time.monotonic_ns()}"
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", _MEASURE, str(rss_file), sys.executable, "-m", "gateway", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"gateway {' '.join(args)} ran past {timeout} s")
    seconds = time.monotonic() - started
    return Run(proc.returncode, out, err, seconds, int(rss_file.read_text()))


def config_with(tmp: Path, extra: str, name: str = "gateway.yaml") -> Path:
    conf = tmp / name
    conf.write_text(
        "listen: 127.0.0.1:18080\n" + extra + "upstreams:\n  app: {servers: ['127.0.0.1:9']}\n"
        "routes: [{location: /, upstream: app}]\n"
    )
    return conf


def assert_refused(run: Run, *parts: str, seconds: float = 20) -> None:
    """Exit 1, one line naming everything in ``parts``, quickly, at flat memory."""
    assert run.returncode == 1, run.stderr
    assert len(run.lines()) == 1, run.stderr
    assert "Traceback" not in run.stderr
    for part in parts:
        assert part in run.stderr, (part, run.stderr)
    assert run.seconds < seconds, run.seconds
    assert run.rss_kb < SMALL_RSS_KB, run.rss_kb


# ---- files named in the configuration


def test_dev_zero_as_deny_file_is_refused_at_its_key(tmp_path: Path) -> None:
    conf = config_with(tmp_path, "access:\n  deny_file: /dev/zero\n")
    run = gateway("check", "-c", str(conf), tmp=tmp_path, timeout=60)
    assert_refused(run, f"{conf}:3:", "access.deny_file", "/dev/zero", "not a regular file (a character device)")


def test_a_fifo_as_deny_file_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "deny.fifo"
    os.mkfifo(fifo)
    conf = config_with(tmp_path, f"access:\n  allow: [127.0.0.1]\n  deny_file: {fifo}\n")
    run = gateway("check", "-c", str(conf), tmp=tmp_path, timeout=60)
    assert_refused(run, f"{conf}:4:", "access.deny_file", str(fifo), "not a regular file (a FIFO)")


def test_a_directory_as_allow_file_is_refused(tmp_path: Path) -> None:
    conf = config_with(tmp_path, f"access:\n  allow_file: {tmp_path}\n")
    run = gateway("check", "-c", str(conf), tmp=tmp_path, timeout=60)
    assert_refused(run, f"{conf}:3:", "access.allow_file", "not a regular file (a directory)")


@pytest.mark.timing
def test_dev_zero_as_certificate_and_key_is_refused_at_each_key(tmp_path: Path) -> None:
    conf = config_with(tmp_path, "ssl_certificate: /dev/zero\nssl_certificate_key: /dev/urandom\n")
    run = gateway("check", "-c", str(conf), tmp=tmp_path, timeout=60)
    assert run.returncode == 1 and run.seconds < 20 and run.rss_kb < SMALL_RSS_KB, (run.stderr, run.seconds)
    assert f"{conf}:2:" in run.stderr and "ssl_certificate: cannot read the certificate file /dev/zero" in run.stderr
    assert f"{conf}:3:" in run.stderr and "ssl_certificate_key: cannot read the key file /dev/urandom" in run.stderr
    assert "not a regular file (a character device)" in run.stderr and "Traceback" not in run.stderr


def test_an_oversized_certificate_is_refused_by_its_size(tmp_path: Path) -> None:
    big = tmp_path / "big.pem"
    big.write_bytes(b"-----BEGIN CERTIFICATE-----\n" + b"A" * (2 * MB))
    conf = config_with(tmp_path, f"ssl_certificate: {big}\nssl_certificate_key: {big}\n")
    run = gateway("check", "-c", str(conf), tmp=tmp_path, timeout=60)
    assert run.returncode == 1 and "larger than 1 MiB" in run.stderr and f"{conf}:2:" in run.stderr, run.stderr
    assert run.rss_kb < SMALL_RSS_KB


@pytest.mark.timing
def test_dev_zero_and_a_fifo_as_tls_ca_are_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "ca.fifo"
    os.mkfifo(fifo)
    conf = tmp_path / "gateway.yaml"
    conf.write_text(
        "listen: 127.0.0.1:18080\nupstreams:\n"
        "  a: {servers: ['127.0.0.1:9'], scheme: https, tls_ca: /dev/zero}\n"
        f"  b: {{servers: ['127.0.0.1:9'], scheme: https, tls_ca: {fifo}}}\n"
        "routes: [{location: /, upstream: a}, {location: /b, upstream: b}]\n"
    )
    run = gateway("check", "-c", str(conf), tmp=tmp_path, timeout=60)
    assert run.returncode == 1 and run.seconds < 20 and run.rss_kb < SMALL_RSS_KB, (run.stderr, run.seconds)
    assert f"{conf}:3:" in run.stderr and "upstreams.a.tls_ca" in run.stderr and "/dev/zero" in run.stderr
    assert f"{conf}:4:" in run.stderr and "upstreams.b.tls_ca" in run.stderr and "(a FIFO)" in run.stderr


def test_the_configuration_itself_as_a_fifo_or_a_device(tmp_path: Path) -> None:
    fifo = tmp_path / "gateway.yaml"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero"):
        run = gateway("check", "-c", path, tmp=tmp_path, timeout=60)
        assert_refused(run, path, "not a regular file")


def test_ban_file_refuses_a_device_and_a_fifo(tmp_path: Path) -> None:
    conf = config_with(tmp_path, f"admin: {{listen: 127.0.0.1:{free_port()}, token: {'t' * 32}}}\n")
    fifo = tmp_path / "list.fifo"
    os.mkfifo(fifo)
    for command in ("ban", "unban"):
        for path in ("/dev/zero", str(fifo)):
            run = gateway(command, "--file", path, "-c", str(conf), tmp=tmp_path, timeout=60)
            assert_refused(run, f"cannot read {path}: not a regular file")


def write_blocklist(path: Path, size: int, seed: int = 42) -> int:
    """A blocklist as public feeds look (bare IPv4 addresses, /24s with a Spamhaus-style comment,
    IPv6 /64s, comment lines) of ``size`` bytes or just under; its number of lines."""
    rng = random.Random(seed)
    lines = ["# generated for test_file_bounds\n"]
    total = len(lines[0])
    while True:
        x = rng.random()
        if x < 0.75:
            line = f"{rng.randrange(1, 224)}.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}\n"
        elif x < 0.93:
            line = f"{rng.randrange(1, 224)}.{rng.randrange(256)}.{rng.randrange(256)}.0/24 ; SBL{rng.randrange(10**5, 10**6)}\n"
        elif x < 0.97:
            line = f"2001:db8:{rng.randrange(65536):x}:{rng.randrange(65536):x}::/64\n"
        else:
            line = "# listed\n"
        if total + len(line) > size:
            break
        lines.append(line)
        total += len(line)
    path.write_text("".join(lines))
    return len(lines)


def test_a_42_mb_blocklist_is_refused_at_once_with_what_to_do(tmp_path: Path) -> None:
    big = tmp_path / "feed.txt"
    write_blocklist(big, 42_000_000)
    assert big.stat().st_size > 41_000_000
    conf = config_with(tmp_path, f"access:\n  deny_file: {big}\n")
    run = gateway("check", "-c", str(conf), tmp=tmp_path, timeout=60)
    assert_refused(run, f"{conf}:3:", "access.deny_file", "larger than 16 MiB", "aggregate it into CIDRs", seconds=10)
    plain = config_with(tmp_path, "", name="plain.yaml")
    banned = gateway("ban", "--file", str(big), "-c", str(plain), tmp=tmp_path, timeout=60)
    assert_refused(banned, f"cannot read {big}: larger than 16 MiB, the bound for a blocklist", seconds=10)


def test_a_blocklist_just_under_the_bound_checks_at_bounded_memory(tmp_path: Path) -> None:
    """Some 950,000 entries: the most a list may hold, read in bounded time and memory."""
    feed = tmp_path / "feed.txt"
    write_blocklist(feed, MAX_BYTES - 1024)
    conf = config_with(tmp_path, f"access:\n  deny_file: {feed}\n")
    run = gateway("check", "-c", str(conf), tmp=tmp_path, timeout=180)
    assert run.returncode == 0, run.stderr
    assert run.rss_kb < 450 * 1024, run.rss_kb  # measured: about 275 MB


def test_a_blocklist_of_too_many_entries_is_refused_at_the_line_past_the_bound() -> None:
    with pytest.raises(FileRefused, match=r"more than 3 entries, the bound for a blocklist \(line 5\)"):
        parse_blocklist(["1.2.3.4\n", "# note\n", "5.6.7.8\n", "bad\n", "9.9.9.9\n"], max_entries=3)


def test_a_pipe_is_read_only_up_to_the_bound(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.write(write, b"1.2.3.4\n" * 100)
    os.close(write)
    with os.fdopen(read, "rb") as handle, pytest.raises(FileTooLarge):
        for _ in bounded_lines(handle, 500):
            pass
    (tmp_path / "f").write_bytes(b"x" * 10)
    assert read_bounded(str(tmp_path / "f"), 10) == b"x" * 10
    with pytest.raises(FileTooLarge):
        read_bounded(str(tmp_path / "f"), 9)


async def test_a_reload_with_dev_zero_keeps_serving_the_old_config_at_flat_memory(
    gateway_factory: Callable[..., Gateway], upstream: Upstream, tmp_path: Path
) -> None:
    import aiohttp

    admin = free_port()
    deny = tmp_path / "deny.txt"
    deny.write_text("203.0.113.0/24\n")

    def build(port: int, deny_file: str = str(deny)) -> str:
        return (
            f"listen: 127.0.0.1:{port}\nworkers: 1\nadmin: {{listen: 127.0.0.1:{admin}, token: {'t' * 32}}}\n"
            f"log: {{access: off}}\naccess:\n  deny_file: {deny_file}\n"
            f"upstreams:\n  app: {{servers: [{upstream.address}]}}\nroutes: [{{location: /, upstream: app}}]\n"
        )

    gw = gateway_factory(build)
    assert gw.proc is not None

    async def status() -> int:
        async with aiohttp.ClientSession() as session, session.get(gw.url + "/") as resp:
            await resp.read()
            return resp.status

    assert await status() == 200
    before = tree_peak_rss_kb(gw.proc.pid)
    for hostile in ("/dev/zero", "/dev/urandom"):
        gw.config_path.write_text(build(gw.port, hostile))
        reload = cli("reload", "-c", str(gw.config_path), timeout=60)
        assert reload.returncode == 1 and "access.deny_file" in reload.stderr and hostile in reload.stderr
        assert await status() == 200
    assert tree_peak_rss_kb(gw.proc.pid) < before + 30 * 1024


def tree_peak_rss_kb(pid: int) -> int:
    """The largest peak RSS (VmHWM) of ``pid`` and its children, in kB."""
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    peak = 0
    for one in pids:
        for line in Path(f"/proc/{one}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak = max(peak, int(line.split()[1]))
    return peak


# ---- gateway import-nginx


def nginx_conf(tmp: Path, http_body: str) -> Path:
    conf = tmp / "nginx.conf"
    conf.write_text("events {}\nhttp {\n" + http_body + "}\n")
    return conf


def test_200_includes_of_a_1_mb_file_stop_at_the_budget(tmp_path: Path) -> None:
    lines, size, i = [], 0, 0
    while size < 1_000_000:
        lines.append(f'    set $v{i} "value {i}";  # a comment\n')
        size, i = size + len(lines[-1]), i + 1
    (tmp_path / "big.conf").write_text("".join(lines))
    body = "  server {\n    listen 80;\n    location / {\n" + "      include big.conf;\n" * 200 + "    }\n  }\n"
    conf = nginx_conf(tmp_path, body)
    run = gateway("import-nginx", str(conf), "-o", str(tmp_path / "out.yaml"), tmp=tmp_path, timeout=120)
    assert run.returncode == 1 and len(run.lines()) == 1, run.stderr
    budget = ("more than 250000 directives", "more than 16 MiB", "took longer than 30 s")  # whichever comes first
    assert any(part in run.stderr for part in budget), run.stderr
    assert run.rss_kb < 300 * 1024, run.rss_kb  # measured: about 155 MB


def test_includes_of_comments_stop_at_the_byte_budget(tmp_path: Path) -> None:
    (tmp_path / "notes.conf").write_text(("# " + "x" * 1000 + "\n") * 1000)  # 1 MB, no directive
    conf = nginx_conf(tmp_path, "  include notes.conf;\n" * 200)
    run = gateway("import-nginx", str(conf), "-o", str(tmp_path / "out.yaml"), tmp=tmp_path, timeout=120)
    over = f"{conf}:19: the files read come to more than 16 MiB"  # at the 17th 1 MB file
    assert run.returncode == 1 and over in run.stderr, run.stderr
    assert MAX_TOTAL_BYTES == 16 * MB
    assert run.rss_kb < 200 * 1024, run.rss_kb


@pytest.mark.parametrize("pattern", ["/*/*/*/*/*/*", "/*/*/*", "/[a-z]*/*/*.conf"])
def test_a_glob_that_walks_the_tree_is_refused_without_walking(tmp_path: Path, pattern: str) -> None:
    conf = nginx_conf(tmp_path, f"  include {pattern};\n")
    run = gateway("import-nginx", str(conf), "-o", str(tmp_path / "out.yaml"), tmp=tmp_path, timeout=60)
    assert_refused(run, f"{conf}:3:", f'the glob "{pattern}" has wildcards in', "walk a directory tree", seconds=10)


def test_a_glob_still_includes_what_real_configurations_include(tmp_path: Path) -> None:
    (tmp_path / "conf.d").mkdir()
    for name in ("b.conf", "a.conf"):
        (tmp_path / "conf.d" / name).write_text(f"server {{ listen 80; server_name {name[0]}.example; }}\n")
    conf = nginx_conf(tmp_path, "  include conf.d/*.conf;\n")
    from gateway.nginxconf.parser import parse_config

    http = parse_config(str(conf))[1]
    assert http.block is not None
    assert [d.block[1].args for d in http.block if d.block] == [["a.example"], ["b.example"]]


def test_include_of_a_fifo_or_a_device_does_not_block(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "site.conf")
    conf = nginx_conf(tmp_path, "  include site.conf;\n  include /dev/zero;\n")
    run = gateway("import-nginx", str(conf), "-o", str(tmp_path / "out.yaml"), tmp=tmp_path, timeout=60)
    assert_refused(run, f"{conf}:3:", "site.conf: not a regular file (a FIFO)", seconds=10)
    (tmp_path / "site.conf").unlink()
    (tmp_path / "site.conf").write_text("")
    run = gateway("import-nginx", str(conf), "-o", str(tmp_path / "out.yaml"), tmp=tmp_path, timeout=60)
    assert_refused(run, f"{conf}:4:", "/dev/zero: not a regular file (a character device)", seconds=10)
    os.mkfifo(tmp_path / "glob.fifo.conf")
    conf = nginx_conf(tmp_path, "  include *.fifo.conf;\n")
    run = gateway("import-nginx", str(conf), "-o", str(tmp_path / "out.yaml"), tmp=tmp_path, timeout=60)
    assert_refused(run, "glob.fifo.conf: not a regular file (a FIFO)", seconds=10)
