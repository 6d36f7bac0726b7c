"""``gateway replay`` on a real gateway's own access log: it must replay the limit_req status
each request was logged with (the known-answer tests are tests/unit/replay/test_replay.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from gateway.plan import load_config_text
from gateway.replay.logread import Timing, line_parser, read_requests
from gateway.replay.simulate import Simulator
from tests.support.gateway import Gateway
from tests.support.upstreams import Upstream

CONFIG = """
listen: 127.0.0.1:{port}
admin: {{listen: "off"}}
log: {{access: stdout, format: '$remote_addr [$msec] "$request" $status rt=$request_time lreq=$limit_req_status'}}
upstreams: {{app: {{servers: ["{upstream}"]}}}}
zones:
  ip: {{type: req, key: $binary_remote_addr, rate: 2r/s}}
  five: {{type: req, key: $remote_addr, rate: 5r/s}}
routes:
  - {{location: /, upstream: app}}
  - {{location: /api/, upstream: app, limit_req: [{{zone: ip}}]}}
  - {{location: /burst/, upstream: app, limit_req: [{{zone: five, burst: 3, delay: 1}}]}}
"""
TEMPLATE = '$remote_addr [$msec] "$request" $status rt=$request_time lreq=$limit_req_status'


#   excess:  0     1000  1850  2700  3550  3400  3250  3100  1000  1950   (a new key starts at 0)
#            PASS  PASS  DELAY DELAY REJ   REJ   REJ   REJ   PASS  DELAY
# Nearest boundaries are 100 milli-requests (20 ms) away, except 30 ms (1000 = the delay threshold, reached
# from an empty bucket either way). The gateway's own clock and delay timers may differ from this by a few
# ms; the test compares the replay with what the gateway logged, not with this table.
SCHEDULE_MS = (0, 30, 60, 90, 120, 150, 180, 210, 600, 610)


async def _schedule(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.05

        async def get(path: str, at_ms: int) -> None:
            await asyncio.sleep(max(0.0, start + at_ms / 1000 - loop.time()))
            async with session.get(url + path) as resp:
                await resp.read()

        await asyncio.gather(*(get("/burst/", at) for at in SCHEDULE_MS), get("/api/", 0))


@pytest.mark.timing
def test_round_trip_reproduces_the_logged_limit_req_status(
    gateway_factory: Callable[..., Gateway], tmp_path: Path
) -> None:
    upstream = Upstream("rt").start()
    try:
        text = CONFIG.format(port="{port}", upstream=upstream.address)
        gw = gateway_factory(lambda port: text.replace("{port}", str(port)))
        asyncio.run(_schedule(gw.url))
        lines = [line for line in gw.access_lines(wait=0.4) if "lreq=" in line]
    finally:
        upstream.stop()
    assert len(lines) == len(SCHEDULE_MS) + 1
    config = load_config_text(text.replace("{port}", "1"))
    parse, _ = line_parser(TEMPLATE)
    outcomes = list(Simulator(config).run(read_requests(lines, parse, Timing())))
    first = outcomes[0].t_ms
    table = "\n".join(
        f"{o.t_ms - first:5} {o.logged['request']} rt={o.logged['request_time']} "
        f"logged={o.logged['limit_req_status'] or '-'} replayed={o.limit_req_status or '-'}"
        for o in outcomes
    )
    burst = [o for o in outcomes if "/burst/" in o.logged["request"]]
    assert {"PASSED", "DELAYED", "REJECTED"} <= {o.logged["limit_req_status"] for o in burst}, table
    assert [o.limit_req_status or "-" for o in outcomes] == [o.logged["limit_req_status"] or "-" for o in outcomes], (
        table
    )
