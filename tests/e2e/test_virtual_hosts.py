"""Virtual hosts (servers:) through the CLI-started gateway over real sockets: nginx's
server_name order, default_server per address, listen per server, $server_name."""

from __future__ import annotations

import asyncio

from tests.support.ports import free_port, wait_port


async def ask(port: int, host: bytes, target: bytes = b"/", addr: str = "127.0.0.1") -> bytes:
    reader, writer = await asyncio.open_connection(addr, port)
    writer.write(b"GET " + target + b" HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n")
    await writer.drain()
    out = await asyncio.wait_for(reader.read(65536), 5)
    writer.close()
    return out


def body(response: bytes) -> str:
    return response.split(b"\r\n\r\n", 1)[1].decode()


def vhost_config(port: int, port2: int, dead: int) -> str:
    def server(names: str, extra: str = "") -> str:
        return f"""
  - server_name: {names}{extra}
    routes:
      - location: /
        return: {{code: 200, text: "$server_name|$host"}}
      - location: /proxy/
        upstream: dead
"""

    return (
        f"""
listen: 127.0.0.1:{port}
shutdown_timeout: 5s
log:
  format: "$server_name $status $request_uri"
upstreams:
  dead:
    servers: [127.0.0.1:{dead}]
    connect_timeout: 1s
servers:"""
        + server('[first.test, "*.first.test"]')
        + server('[api.example.com, "*.example.org", "*.b.example.org"]')
        + server('["www.example.*", "*.org"]')
        + server('["~^(?<sub>[a-z]+)\\\\.example\\\\.net$"]')
        + server('["~^a.+\\\\.example\\\\.net$"]')
        + server("[fallback.test]", "\n    default_server: true")
        + server("[other.test]", f"\n    listen: [127.0.0.1:{port2}]")
    )


async def test_server_name_order_default_server_and_listen_per_server(gateway_factory):
    port2, dead = free_port(), free_port()
    gw = gateway_factory(lambda p: vhost_config(p, port2, dead))
    wait_port(port2)
    cases = {
        b"api.example.com": "api.example.com|api.example.com",  # exact
        b"API.Example.COM:8080": "api.example.com|api.example.com",  # case-insensitive, port dropped
        b"api.example.com.": "api.example.com|api.example.com",  # a trailing dot names the same host; nginx drops it from $host
        b"x.b.example.org": "api.example.com|x.b.example.org",  # longest leading wildcard
        b"x.c.example.org": "api.example.com|x.c.example.org",  # *.example.org beats *.org
        b"z.org": "www.example.*|z.org",
        # no exact name, no leading wildcard (*.example.org does not match): www.example.*, before any regex
        b"www.example.com": "www.example.*|www.example.com",
        b"www.example.io": "www.example.*|www.example.io",  # trailing wildcard
        b"abc.example.net": "~^(?<sub>[a-z]+)\\.example\\.net$|abc.example.net",  # both match: the first
        b"a-1.example.net": "~^a.+\\.example\\.net$|a-1.example.net",  # only the second
        b"unknown.test": "fallback.test|unknown.test",  # default_server, although not the first
        b"other.test": "fallback.test|other.test",  # other.test does not listen here
    }
    for host, expected in cases.items():
        out = await ask(gw.port, host)
        assert out.startswith(b"HTTP/1.1 200"), (host, out[:60])
        assert body(out) == expected, host
    # an empty Host is refused, as nginx refuses it ("client sent invalid host header")
    assert (await ask(gw.port, b"")).startswith(b"HTTP/1.1 400")
    # an absolute-form target's authority is the host, whatever Host says
    out = await ask(gw.port, b"fallback.test", b"http://api.example.com/")
    assert body(out) == "api.example.com|api.example.com"
    # the second address has one server: every name gets it
    out = await ask(port2, b"api.example.com")
    assert body(out) == "other.test|api.example.com"
    # $server_name in the access log and in the error log's server: field
    out = await ask(gw.port, b"x.first.test", b"/proxy/x")
    assert out.startswith(b"HTTP/1.1 502")
    assert "first.test 502 /proxy/x" in gw.access_lines()
    assert "server: first.test," in gw.stderr()


def test_servers_config_errors(tmp_path):
    import subprocess
    import sys

    from tests.support.paths import ROOT

    path = tmp_path / "bad.yaml"
    path.write_text(
        """upstreams:
  app: {servers: [127.0.0.1:9000]}
routes:
  - {location: /, upstream: app}
servers:
  - server_name: ["a*b.example", "~(unclosed"]
    listen: [127.0.0.1:8081]
    default_server: true
    routes: [{location: /, upstream: app}]
  - server_name: b.example
    listen: 127.0.0.1:8081
    default_server: true
    routes: [{location: ~ ^/x, upstream: app, uri: /y}]
"""
    )
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "check", "-c", str(path)], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = [line.split(": ", 1)[1] for line in proc.stderr.splitlines()]
    assert lines == [
        f"{path}:5:1: servers: use either routes (one server) or servers (virtual hosts), not both",
        f'{path}:6:19: servers[0].server_name[0]: invalid server name "a*b.example": '
        'a wildcard is allowed only as "*.name" or "name.*"',
        f"{path}:6:34: servers[0].server_name[1]: invalid regular expression '(unclosed': "
        "missing ), unterminated subpattern at position 0",
        f"{path}:12:21: servers[1].default_server: a duplicate default server for 127.0.0.1:8081 (first at servers[0])",
        f"{path}:13:52: servers[1].routes[0].uri: a uri cannot be given for a location given by regular expression "
        "(as in nginx)",
    ]


async def test_a_specific_address_hides_the_wildcard_servers_on_it(gateway_factory):
    # one socket (0.0.0.0:port) serves both; the address the client reached picks the servers
    def config(port: int) -> str:
        return f"""
listen: 127.0.0.1:{port}
shutdown_timeout: 5s
servers:
  - server_name: wild.test
    listen: 0.0.0.0:{port}
    routes: [{{location: /, return: {{code: 200, text: "wild $server_name"}}}}]
  - server_name: local.test
    routes: [{{location: /, return: {{code: 200, text: "local $server_name"}}}}]
"""

    gw = gateway_factory(config)
    assert body(await ask(gw.port, b"wild.test")) == "local local.test"  # 127.0.0.1 has its own server
    assert body(await ask(gw.port, b"local.test", addr="127.0.0.2")) == "wild wild.test"
