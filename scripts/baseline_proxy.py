"""A bare aiohttp + uvloop pass-through proxy, written only as the benchmark's baseline.

It does what the simplest competent aiohttp proxy does and nothing more: one
ClientSession with keep-alive, hop-by-hop headers dropped, small bodies read whole,
no routing, no limits, no logging.

    python scripts/baseline_proxy.py LISTEN_PORT UPSTREAM_HOST:PORT
"""

from __future__ import annotations

import asyncio
import sys

import aiohttp
import uvloop
from aiohttp import web

HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
    "trailer",
    "proxy-authenticate",
    "proxy-authorization",
    "host",
    "content-length",
}


async def main(port: int, upstream: str) -> None:
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
    )
    base = f"http://{upstream}"

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        data = request.content if request.body_exists else None
        async with session.request(
            request.method, base + request.raw_path, headers=headers, data=data, allow_redirects=False
        ) as resp:
            body = await resp.read()
            out = {k: v for k, v in resp.headers.items() if k.lower() not in HOP}
            return web.Response(status=resp.status, headers=out, body=body)

    server = web.Server(handle, auto_decompress=False)
    runner = web.ServerRunner(server)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=511).start()
    print(f"baseline proxy on 127.0.0.1:{port} -> {upstream}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1]), sys.argv[2]))
