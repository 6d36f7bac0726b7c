"""``gateway.runtime.notify``: the addresses systemd hands out, and no socket no message."""

from __future__ import annotations

import os
import socket

import pytest

from gateway.runtime import notify


def test_an_abstract_socket_receives_the_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"gateway-notify-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify.ready("serving on 127.0.0.1:8080")
        assert sock.recv(4096) == b"READY=1\nSTATUS=serving on 127.0.0.1:8080"
        assert notify.stopping()
        assert sock.recv(4096) == b"STOPPING=1"


@pytest.mark.parametrize("value", ["", "vsock:2:1234", "@", "relative/path"])
def test_without_a_usable_socket_nothing_is_sent(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", value)
    assert notify.ready() is False


def test_a_worker_does_not_inherit_the_socket() -> None:
    env = {"NOTIFY_SOCKET": "/run/systemd/notify", "PATH": "/usr/bin"}
    assert notify.child_environment(env) == {"PATH": "/usr/bin"}
