"""What a scrape reads: this process's counters, or every worker's through the master."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.metrics import channel, stats
from gateway.metrics.activity import ConfigInfo

channel.register("metrics", stats.STATS.snapshot, stats.merge, stats.retire)


class MetricsHub:
    """What a scrape reads: this process alone, or (the master of ``workers: N``) every worker."""

    def __init__(self, config: ConfigInfo, workers: channel.StatsServer | None = None) -> None:
        self.config = config
        self.workers = workers

    async def collect(self) -> dict[str, Any]:
        if self.workers is not None:
            return await self.workers.collect()
        return channel.merged([channel.local_snapshot()])

    async def render(self) -> bytes:
        data = await self.collect()  # on the loop: snapshots only (about 1 ms for 50 routes)
        workers = self.workers.answered if self.workers is not None else 1
        # The text (tens of ms for a thousand series) is written off the serving loop, which also
        # serves the workers' limit state in the master: it only ever waits for the GIL's slices.
        from gateway.metrics.render import render  # prometheus_client: imported at the first scrape

        return await asyncio.to_thread(render, data.get("metrics", {}), self.config, workers)
