from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import Gateway, Upstream, free_port


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream("up1").start()
    yield up
    up.stop()


@pytest.fixture
def upstream2() -> Iterator[Upstream]:
    up = Upstream("up2").start()
    yield up
    up.stop()


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    started: list[Gateway] = []

    def make(
        config: str | Callable[[int], str],
        *,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        port: int | None = None,
        start: bool = True,
    ) -> Gateway:
        port = port or free_port()
        text = config(port) if callable(config) else config
        workdir = tmp_path / f"gw{len(started)}"
        workdir.mkdir()
        gw = Gateway(workdir, text, port, extra_args=extra_args, env=env)
        started.append(gw)
        return gw.start() if start else gw

    yield make
    for gw in started:
        gw.stop()
