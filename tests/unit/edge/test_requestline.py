"""The framer finds every request start in a pipeline, however the bytes are cut into packets."""

from __future__ import annotations

import pytest

from gateway.edge.requestline import BOUNDARY, UNKNOWN, Framer

HOST = b"Host: a\r\n"
PIPELINE = (
    b"POST /a HTTP/1.1\r\n" + HOST + b"Content-Length: 5\r\n\r\nhello"
    b"PURGE /b HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\n"
    b"4;x=y\r\nFOO \r\n0\r\nT: v\r\n\r\n"
    b"\r\nREFRESH /c HTTP/1.1\r\n" + HOST + b"content-length:  3 \r\n\r\nBAR"
    b"GET /d HTTP/1.1\r\n" + HOST + b"\r\n"
)
# What the parser is fed: the custom methods renamed (PURGE is one llhttp knows), bodies untouched.
FED = PIPELINE.replace(b"REFRESH /c", b"GET /c")
METHODS = [None, None, "REFRESH", None]


def run(framer: Framer, pieces: list[bytes]) -> tuple[bytes, list[str | None], list[bytes]]:
    fed = b""
    methods: list[str | None] = []
    parts: list[bytes] = []
    held = b""
    for piece in pieces:
        scan = framer.scan(held + piece)
        assert not scan.http09 and not scan.rest
        held = scan.held
        fed += b"".join(scan.parts)
        parts += scan.parts
        methods += scan.methods
    return fed + held, methods, parts


def test_a_whole_pipeline_is_cut_into_one_part_per_request():
    fed, methods, parts = run(Framer(), [PIPELINE])
    assert (fed, methods) == (FED, METHODS)
    assert [p.split(b" ", 1)[0].strip(b"\r\n") for p in parts] == [b"POST", b"PURGE", b"GET", b"GET"]


def test_every_cut_into_two_packets_finds_the_same_requests():
    for cut in range(1, len(PIPELINE)):
        framer = Framer()
        fed, methods, _ = run(framer, [PIPELINE[:cut], PIPELINE[cut:]])
        assert (fed, methods) == (FED, METHODS), cut
        assert framer.state == BOUNDARY, cut


def test_byte_by_byte_finds_the_same_requests():
    framer = Framer()
    fed, methods, _ = run(framer, [PIPELINE[i : i + 1] for i in range(len(PIPELINE))])
    assert (fed, methods) == (FED, METHODS)


@pytest.mark.parametrize(
    "header",
    [
        b"Content-Length: 5\r\nContent-Length: 5\r\n",  # the parser refuses it
        b"Content-Length: +5\r\n",
        b"Transfer-Encoding: gzip, chunked\r\n",  # 501
        b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
    ],
)
def test_a_framing_the_parser_refuses_is_not_followed(header):
    framer = Framer()
    scan = framer.scan(b"POST /a HTTP/1.1\r\nHost: a\r\n" + header + b"\r\nhelloFOO /b HTTP/1.1\r\n\r\n")
    assert scan.methods == [None] and framer.state == UNKNOWN
    assert b"FOO /b" in b"".join(scan.parts)  # left as it came: the parser's verdict stands


@pytest.mark.parametrize("line", [b"5 \r\n", b"5\n", b"x\r\n", b"\r\n"])
def test_a_chunk_line_llhttp_refuses_stops_the_framer(line):
    framer = Framer()
    framer.scan(b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + line)
    assert framer.state == UNKNOWN


def test_a_protocol_switch_ends_the_scan_and_leaves_the_rest_as_it_came():
    framer = Framer()
    head = b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n"
    scan = framer.scan(head + b"FOO /b HTTP/1.1\r\n\r\n")
    assert scan.parts == [head] and scan.rest == b"FOO /b HTTP/1.1\r\n\r\n"
    assert framer.state == BOUNDARY  # if the switch is declined, a request starts there


def test_http09_is_spotted_only_at_the_start():
    assert Framer().scan(b"GET /x\r\n").http09
