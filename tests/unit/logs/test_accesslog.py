"""Access log lines: nginx's formats and escaping, byte for byte."""

from __future__ import annotations

import json

from multidict import CIMultiDict, CIMultiDictProxy

from gateway.http.realip import parse_addr
from gateway.logs.access import Fields, _Clock, _render_json, compile_template
from gateway.logs.formats import PRESETS


class _Version:
    major = 1
    minor = 1


class _Request:
    method = "GET"
    version = _Version()
    raw_path = "/a?b=1"
    remote = "127.0.0.1"

    def __init__(self, headers: list[tuple[str, str]]) -> None:
        self.headers = CIMultiDictProxy(CIMultiDict(headers))


class _Response:
    status = 200
    content_length = 5
    body_length = 200


class _Ctx:
    client = parse_addr("203.0.113.7")
    peer = parse_addr("127.0.0.1")
    raw_target = "/a?b=1"
    request_target = "/a?b=1"
    status = 0
    body_bytes_sent = 5
    uri = "/a"
    raw_query = "b=1"
    host = "example.com"
    upstream_addr = "10.0.0.1:80"
    upstream_status = "200"
    upstream_time = "0.004"
    limit_req_status = "DELAYED"
    limit_conn_status = ""
    limit_count_status = ""
    algo_status = None
    route = None
    server_port = 8080
    scheme = "http"


def fields(headers: list[tuple[str, str]]) -> Fields:
    clock = _Clock()
    clock.refresh(1_795_000_000)
    return Fields(_Ctx(), _Request(headers), _Response(), 0.0123, clock)  # type: ignore[arg-type]


def test_combined_is_nginx_combined():
    line = compile_template(PRESETS["combined"])(
        fields([("User-Agent", "curl/8.0"), ("Authorization", "Basic YWxpY2U6cHc=")])
    )
    assert line.startswith("203.0.113.7 - alice [")
    assert line.endswith('] "GET /a?b=1 HTTP/1.1" 200 5 "-" "curl/8.0"')


def test_values_are_escaped_like_nginx():
    render = compile_template('"$http_user_agent" $http_x_empty $limit_conn_status')
    line = render(fields([("User-Agent", 'say "hi"\\ \x01\x7f')]))
    assert line == '"say \\x22hi\\x22\\x5C \\x01\\x7F" - -'


def test_repeated_headers_join_with_commas():
    assert (
        compile_template("$http_x_forwarded_for")(
            fields([("X-Forwarded-For", "1.1.1.1"), ("X-Forwarded-For", "2.2.2.2")])
        )
        == "1.1.1.1, 2.2.2.2"
    )


def test_json_lines_have_typed_fields():
    record = json.loads(_render_json(fields([("User-Agent", 'x"y')])))
    assert record["status"] == 200 and record["body_bytes_sent"] == 5 and record["request_time"] == 0.012
    assert record["http_user_agent"] == 'x"y' and record["remote_addr"] == "203.0.113.7"
    assert record["limit_req_status"] == "DELAYED" and record["realip_remote_addr"] == "127.0.0.1"
