"""What a large ban list costs one gateway process: memory per ban, and the lookup per request.

    .venv/bin/python scripts/bench_ban_memory.py [--count 100000]

Memory is measured with tracemalloc around filling a ``BanList`` (the table every
serving process keeps) with a mixed list (IPv4 /32, /24, /16; IPv6 /128, /64, timed
bans with a shared reason, as a feed import makes them), and separately around a
``CidrSet`` of the same networks (``access.deny_file``). The lookup is timed for a
client address that is not banned (the common case: every prefix length is probed)
against an empty table and the full one.
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import random
import timeit
import tracemalloc

from gateway.bans.table import Ban, BanList, CidrSet, net_key
from gateway.clock import epoch_ms
from gateway.http.realip import parse_addr


def mixed(count: int) -> list[str]:
    rng = random.Random(13)
    out: dict[str, None] = {}
    for plen, share in ((32, 40), (24, 20), (16, 5), (128, 20), (64, 15)):
        goal = len(out) + count * share // 100
        while len(out) < goal:
            if plen <= 32:
                value = ((rng.randint(11, 223) << 24) | rng.getrandbits(24)) >> (32 - plen) << (32 - plen)
                out[f"{ipaddress.IPv4Address(value)}/{plen}"] = None
            else:
                value = ((0x20010DB8 << 96) | rng.getrandbits(96)) >> (128 - plen) << (128 - plen)
                out[f"{ipaddress.IPv6Address(value)}/{plen}"] = None
    return list(out)


def measure(count: int) -> None:
    targets = mixed(count)
    now = epoch_ms()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    table = BanList()
    for target in targets:
        # as decoded from Redis or the admin API: a new string for each target, shared reason
        table.put(Ban("".join(target), now + 86_400_000, "feed", now, "cli"))
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    print(f"BanList, {len(table):,} bans: {used / 2**20:.1f} MiB, {used / len(table):.0f} bytes per ban")

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    static = CidrSet(net_key(t) for t in targets)
    used_static = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    each = used_static / len(static)
    print(f"CidrSet (access lists), {len(static):,} networks: {used_static / 2**20:.1f} MiB, {each:.0f} bytes each")

    client = parse_addr("192.0.2.1")
    assert client is not None
    empty = BanList()
    rounds = 200_000
    t_empty = min(timeit.repeat(lambda: empty.match(client, now), number=rounds, repeat=5)) / rounds
    t_full = min(timeit.repeat(lambda: table.match(client, now), number=rounds, repeat=5)) / rounds
    print(
        f"lookup of an address not banned: empty table {t_empty * 1e9:.0f} ns, "
        f"{len(table):,} bans {t_full * 1e9:.0f} ns"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=100_000)
    measure(parser.parse_args().count)


if __name__ == "__main__":
    main()
