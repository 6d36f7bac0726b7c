"""A small upstream for trying the gateway: it echoes what it received.

``gateway demo-upstream --listen 127.0.0.1:9000 --listen 127.0.0.1:9001``

* ``/`` and anything else: a JSON echo of method, path, headers and body size;
* ``/slow?ms=N``: answers after N milliseconds;
* ``/status/N``: answers with status N;
* ``/bytes/N``: N bytes of body, streamed.
"""

from __future__ import annotations

import asyncio
import os

from aiohttp import web


async def _echo(request: web.Request) -> web.StreamResponse:
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
    payload = {
        "server": request.app["name"],
        "pid": os.getpid(),
        "method": request.method,
        "path": request.raw_path,
        "headers": {k: v for k, v in request.headers.items()},
        "body_bytes": size,
    }
    return web.json_response(payload)


async def _slow(request: web.Request) -> web.Response:
    await asyncio.sleep(int(request.query.get("ms", "1000")) / 1000)
    return web.Response(text=f"slow {request.app['name']}\n")


async def _status(request: web.Request) -> web.Response:
    status = int(request.match_info["code"])
    return web.Response(status=status, text=f"status {status}\n")


async def _bytes(request: web.Request) -> web.StreamResponse:
    total = int(request.match_info["n"])
    response = web.StreamResponse()
    response.content_length = total
    await response.prepare(request)
    block = b"x" * 65536
    sent = 0
    while sent < total:
        piece = block[: min(len(block), total - sent)]
        await response.write(piece)
        sent += len(piece)
    await response.write_eof()
    return response


def make_app(name: str) -> web.Application:
    app = web.Application()
    app["name"] = name
    app.router.add_get("/slow", _slow)
    app.router.add_get(r"/status/{code:\d+}", _status)
    app.router.add_get(r"/bytes/{n:\d+}", _bytes)
    app.router.add_route("*", "/{tail:.*}", _echo)
    return app


async def serve(addresses: list[tuple[str, int]]) -> None:
    runners = []
    for host, port in addresses:
        runner = web.AppRunner(make_app(f"{host}:{port}"), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        runners.append(runner)
        print(f"demo upstream listening on {host}:{port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        for runner in runners:
            await runner.cleanup()
