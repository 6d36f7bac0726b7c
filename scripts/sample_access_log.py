"""Write a synthetic access log in nginx's ``combined`` format, to try ``gateway replay`` on.

    python3 scripts/sample_access_log.py --lines 1000000 -o /tmp/access.log [--gzip] [--format gateway]

The log covers ``--lines / --rate`` seconds. One scraper (203.0.113.7) sends a tenth of
the requests, well over ``conf/limits.yaml``'s 10r/s per client, so the replay report
has rejected and delayed requests to show; the rest come from ``--clients`` IPv4
addresses, one in fifty of them sending ten times as often as the others.
``--format gateway`` adds the gateway's own fields (``rt=$request_time`` and the
upstream and limit fields), as ``log.format: gateway`` writes them. Paths are under
``/api/`` (the route of ``conf/limits.yaml`` with limit_req, limit_count and
limit_conn) and ``/``. The output is the same for the same arguments (a fixed seed).
"""

from __future__ import annotations

import argparse
import gzip
import random
import sys
import time
from typing import IO

PATHS = ("/api/users", "/api/orders?page=2", "/api/search?q=shoes", "/", "/static/app.js", "/login")
AGENTS = ("Mozilla/5.0 (X11; Linux x86_64)", "curl/8.5.0", "python-requests/2.31")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000, help="how many lines (default: %(default)s)")
    parser.add_argument("--rate", type=int, default=500, help="requests per second of log time (default: %(default)s)")
    parser.add_argument("--clients", type=int, default=5_000, help="distinct client addresses (default: %(default)s)")
    parser.add_argument("-o", "--output", default="-", help="the file to write (default: stdout)")
    parser.add_argument("--format", choices=("combined", "gateway"), default="combined")
    parser.add_argument("--gzip", action="store_true", help="write it gzip-compressed")
    args = parser.parse_args(argv)

    rng = random.Random(22)
    clients = [f"198.51.{i // 250 % 250}.{i % 250 + 1}" for i in range(args.clients)]
    heavy = clients[: max(1, args.clients // 50)]
    start = int(time.mktime((2026, 11, 27, 9, 0, 0, 0, 0, -1)))
    out: IO[str]
    if args.output == "-":
        out = sys.stdout
    elif args.gzip:
        out = gzip.open(args.output, "wt", encoding="ascii", compresslevel=6)  # noqa: SIM115 - closed below
    else:
        out = open(args.output, "w", encoding="ascii")  # noqa: SIM115 - closed below
    try:
        for n in range(args.lines):
            second = start + n // args.rate
            draw = rng.random()
            client = "203.0.113.7" if draw < 0.1 else rng.choice(heavy) if draw < 0.3 else rng.choice(clients)
            path = rng.choice(PATHS)
            stamp = time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(second))
            size = rng.randrange(200, 20_000)
            agent = rng.choice(AGENTS)
            line = f'{client} - - [{stamp}] "GET {path} HTTP/1.1" 200 {size} "-" "{agent}"'
            if args.format == "gateway":
                rt = rng.randrange(1, 80) / 1000
                line += f' rt={rt:.3f} ua="127.0.0.1:9000" us=200 ut={rt:.3f} lreq=PASSED lconn=PASSED lcount=-'
            out.write(line + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
