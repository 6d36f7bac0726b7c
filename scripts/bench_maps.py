"""Cost of one ``map`` / ``geo`` lookup, as a zone key sees it, against a key without one; and
of a route's guard ``rules`` (nginx's ``if (...) { return ...; }``), as the request flow runs them.

    .venv/bin/python scripts/bench_maps.py                 # ns per key, timeit
    .venv/bin/python scripts/bench_maps.py --callgrind     # instructions per key, valgrind

Each key case is the key function of a zone of a real configuration (``load_config_text``) called
on a real ``RequestContext``; the key is computed as the limits step computes it once per
request. ``--callgrind`` runs each case under ``valgrind --tool=callgrind`` with N and 2N calls
and prints the difference divided by N (what one call costs, without start-up). Each guard
case is ``first_answer`` over a route's compiled rules for a request that passes them all.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from gateway.http.context import RequestContext
from gateway.http.realip import parse_addr
from gateway.http.rules import first_answer
from gateway.plan import load_config_text

HEAD = "listen: 127.0.0.1:8080\nadmin: {listen: 'off'}\nupstreams: {app: {servers: [127.0.0.1:9000]}}\n"
VARIABLES = """
geo:
  limited: {default: "1", values: {10.0.0.0/8: "0"}}
%s
maps:
  limit_key: {source: $limited, values: {"0": "", "1": $binary_remote_addr}}
  post_key: {source: $request_method, default: "", values: {POST: $binary_remote_addr}}
  bot_key: {source: $http_user_agent, default: "", values: {"~*(bot|crawler|spider)": $http_user_agent}}
"""
# 10,000 networks over 17 prefix lengths (/16 to /32): a miss probes 17 dicts
BIG = "\n".join(f"      10.{i // 256 % 256}.{i % 256}.0/{16 + i % 17}: n{i}" for i in range(10_000))

CASES: dict[str, tuple[str, dict[str, str], str]] = {  # name: (key, headers, method)
    "$binary_remote_addr (no map: reference)": ("$binary_remote_addr", {}, "GET"),
    "map, exact hit: $post_key, POST": ("$post_key", {}, "POST"),
    "map, exact miss -> default: $post_key, GET": ("$post_key", {}, "GET"),
    "geo, 2 networks: $limited": ("$limited", {}, "GET"),
    "geo, 10,000 networks in 17 lengths, miss: $big": ("$big", {}, "GET"),
    "map of a geo: $limit_key (the allowlist)": ("$limit_key", {}, "GET"),
    "map, regex hit: $bot_key, Googlebot": (
        "$bot_key",
        {"User-Agent": "Mozilla/5.0 (compatible; Googlebot/2.1)"},
        "GET",
    ),
    "map, regex miss -> default: $bot_key, a browser": (
        "$bot_key",
        {"User-Agent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Firefox/120.0"},
        "GET",
    ),
}
GUARDS: dict[str, list[str]] = {  # name: the route's rules; the request (GET /index.html) passes them
    "guard, 1 rule: $request_method !~ ^(GET|HEAD|POST)$": ["$request_method !~ ^(GET|HEAD|POST)$"],
    "guard, 1 rule: $request_method = OPTIONS": ["$request_method = OPTIONS"],
    "guard, 1 rule on a map: $bad_bot (the bot blocker)": ["$bad_bot"],
    "guards, 3 rules: method, /.git, scanner user agents": [
        "$request_method !~ ^(GET|HEAD|POST)$",
        '$request_uri ~ "/\\.git"',
        '$http_user_agent ~* "(sqlmap|nikto|masscan)"',
    ],
}


# the bot blocker's idiom: a map of the user agent, tested by a rule (if ($bad_bot) { return 403; })
BAD_BOT = """maps:
  bad_bot: {source: $http_user_agent, default: "0", values: {"~*(sqlmap|nikto|masscan)": "1"}}
"""


def request_context(headers: dict[str, str], method: str, path: str = "/") -> RequestContext:
    request = make_mocked_request(method, path, headers=CIMultiDict(headers))
    peer = parse_addr("192.0.2.1")
    assert peer is not None
    return RequestContext(request, 0.0, peer, "http", 80)


def guard_call(case: str) -> Callable[[], object]:
    rules = "".join(f"      - {{if: '{condition}', return: 403}}\n" for condition in GUARDS[case])
    variables = BAD_BOT if "$bad_bot" in rules else ""
    text = HEAD + variables + f"routes:\n  - location: /\n    upstream: app\n    rules:\n{rules}"
    plan = load_config_text(text, "bench.yaml").routes[0].rules
    ctx = request_context({"User-Agent": "Mozilla/5.0 Firefox/120.0"}, "GET", "/index.html")
    assert first_answer(plan, ctx) is None
    return lambda: first_answer(plan, ctx)


def call_of(case: str) -> Callable[[], object]:
    return guard_call(case) if case in GUARDS else key_call(case)


def key_call(case: str) -> Callable[[], bytes]:
    key, headers, method = CASES[case]
    big = "  big:\n    default: none\n    values:\n" + BIG if key == "$big" else ""  # parsed only when used
    text = HEAD + VARIABLES % big + f"zones:\n  z: {{type: req, key: '{key}', rate: 1r/s}}\n"
    text += "routes:\n  - {location: /, upstream: app, limit_req: [{zone: z}]}\n"
    fn = load_config_text(text, "bench.yaml").routes[0].limit_req[0].key
    ctx = request_context(headers, method)
    return lambda: fn(ctx)


def per_call_ns(fn: Callable[[], object], number: int = 200_000) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e9


def instructions(case: str, n: int, tmp: Path) -> int:
    out = tmp / f"callgrind.{n}"
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--run",
            case,
            str(n),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    text = out.read_text(errors="replace")
    match = re.search(r"^summary:\s+(\d+)", text, re.M) or re.search(r"^totals:\s+(\d+)", text, re.M)
    assert match, "no callgrind summary"
    return int(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--callgrind", action="store_true", help="count instructions under valgrind")
    parser.add_argument("--calls", type=int, default=20_000, help="calls per callgrind run (and twice as many)")
    parser.add_argument("--cases", help="comma-separated case numbers (1-based) to run; default all")
    parser.add_argument("--run", nargs=2, metavar=("CASE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        call = call_of(args.run[0])
        for _ in range(int(args.run[1])):
            call()
        return
    if args.callgrind and not shutil.which("valgrind"):
        raise SystemExit("valgrind is not installed")
    names = [*CASES, *GUARDS]
    chosen = [names[int(i) - 1] for i in args.cases.split(",")] if args.cases else names
    with tempfile.TemporaryDirectory() as tmp:
        for case in chosen:
            if args.callgrind:
                n = args.calls
                small, large = instructions(case, n, Path(tmp)), instructions(case, 2 * n, Path(tmp))
                print(f"{case:<52} {(large - small) / n:8.0f} instructions", flush=True)
            else:
                print(f"{case:<52} {per_call_ns(call_of(case)):8.0f} ns", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
