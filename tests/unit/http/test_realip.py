"""nginx realip semantics (set_real_ip_from / real_ip_header / real_ip_recursive)."""

from __future__ import annotations

import ipaddress

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.http.realip import RealIp, parse_addr


def resolve(peer: str, xff: list[str] | None, trusted: list[str], recursive: bool, header="X-Forwarded-For") -> str:
    headers = CIMultiDict()
    for value in xff or []:
        headers.add(header, value)
    real = RealIp([ipaddress.ip_network(t) for t in trusted], header, recursive)
    addr = parse_addr(peer)
    assert addr is not None
    return real.resolve(addr, CIMultiDictProxy(headers)).text


@pytest.mark.parametrize(
    ("peer", "xff", "recursive", "expected"),
    [
        ("203.0.113.9", ["1.1.1.1"], True, "203.0.113.9"),  # untrusted peer: header ignored
        ("127.0.0.1", ["1.1.1.1, 2.2.2.2"], False, "2.2.2.2"),  # not recursive: the last one
        ("127.0.0.1", ["1.1.1.1, 10.0.0.5"], False, "10.0.0.5"),
        ("127.0.0.1", ["1.1.1.1, 10.0.0.5"], True, "1.1.1.1"),  # recursive skips trusted hops
        ("127.0.0.1", ["10.0.0.7, 10.0.0.5"], True, "10.0.0.7"),  # all trusted: the leftmost
        ("127.0.0.1", ["1.1.1.1", "10.0.0.5"], True, "1.1.1.1"),  # several header lines join
        ("127.0.0.1", ["garbage, 10.0.0.5"], True, "10.0.0.5"),  # bad entry stops the walk
        ("127.0.0.1", ["nonsense"], True, "127.0.0.1"),
        ("127.0.0.1", ["1.1.1.1:8080"], True, "1.1.1.1"),
        ("127.0.0.1", ["[2001:db8::1]:443"], True, "2001:db8::1"),
        ("127.0.0.1", ["2001:db8::2 ,  "], True, "2001:db8::2"),
        ("127.0.0.1", None, True, "127.0.0.1"),
        ("::ffff:127.0.0.1", ["1.1.1.1"], True, "1.1.1.1"),  # v4-mapped peers are v4
    ],
)
def test_forwarded_for(peer, xff, recursive, expected):
    assert resolve(peer, xff, ["127.0.0.1/32", "10.0.0.0/8"], recursive) == expected


def test_x_real_ip_header():
    assert resolve("127.0.0.1", ["9.9.9.9"], ["127.0.0.0/8"], False, header="X-Real-IP") == "9.9.9.9"


def test_binary_remote_addr_is_4_or_16_bytes():
    v4 = parse_addr("192.0.2.1")
    v6 = parse_addr("2001:db8::1")
    assert v4 is not None and v4.packed == bytes([192, 0, 2, 1])
    assert v6 is not None and len(v6.packed) == 16
