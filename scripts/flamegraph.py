"""py-spy flame graphs of the gateway worker under wrk load, as SVG under docs/.

    .venv/bin/pip install -e ".[bench]"          # py-spy
    .venv/bin/python scripts/flamegraph.py --label before      # docs/flame-before-{redis,plain}.svg
    .venv/bin/python scripts/flamegraph.py --label after       # the same after a change

Targets (bench.py's TARGETS): `redis` = gateway+redis+conn (limit_req + limit_conn on Redis),
`plain` = gateway (no limits); --targets picks others, e.g. `req=gateway+req`. The worker is
pinned to CPU 0, wrk (-c50), the upstream and Redis to CPU 1, as in bench.py. py-spy samples
at 250 Hz for --seconds while wrk runs a little longer; `--idle` is off, so the graph shows
where the worker spends CPU. It needs ptrace rights over the worker (root, or
kernel.yama.ptrace_scope = 0).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import bench

DEFAULT = "redis=gateway+redis+conn,plain=gateway"
# Frames above the event loop, in every sample: left out of the summary.
OUTER = {"_run_module_as_main", "_run_code", "&lt;module&gt;", "main", "_run", "_event_loop_run", "Runner.run"}


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit('py-spy is not installed: .venv/bin/pip install -e ".[bench]"')
    return found


def worker_pid(run: bench.Running) -> int:
    """The process serving requests: the gateway itself with workers: 1, else its first child."""
    if run.workers == 1:
        return run.proc.pid
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        kids = bench.children(run.proc.pid)
        if kids:
            return kids[0]
        time.sleep(0.1)
    raise SystemExit(f"{run.name}: no worker process found")


def record(lab: bench.Lab, target: str, out: Path, seconds: float, connections: int) -> None:
    run = bench.TARGETS[target].launch(lab, target)
    bench.wrk(run.url, 2, connections)  # warm-up
    wrk = subprocess.Popen(
        bench.pin(bench.LOAD_CPU) + ["wrk", "-t1", f"-c{connections}", f"-d{seconds + 3:g}s", run.url],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(1)
    cmd = [py_spy(), "record", "--pid", str(worker_pid(run)), "--duration", str(int(seconds)), "--rate", "250"]
    cmd += ["--format", "flamegraph", "--output", str(out), "--nonblocking"]
    subprocess.run(bench.pin(bench.LOAD_CPU) + cmd, check=True, stdout=subprocess.DEVNULL)
    stdout, _ = wrk.communicate()
    print(f"{target}: {bench.parse_wrk(stdout).rps:,.0f} req/s under the profiler -> {out}", flush=True)
    run.proc.terminate()
    try:
        run.proc.wait(40)  # a graceful stop: up to shutdown_timeout (30 s) for requests in flight
    except subprocess.TimeoutExpired:
        print(f"{target}: still running 40 s after SIGTERM; killed", file=sys.stderr, flush=True)
        run.proc.kill()
        run.proc.wait()


def summary(svg: Path, top: int = 25) -> str:
    """The functions with the most inclusive samples, in % of all (frames of one name summed)."""
    text = svg.read_text()
    found = re.search(r"all \(([\d,]+) samples", text)
    total = int(found.group(1).replace(",", "")) if found else 0
    counts: collections.Counter[str] = collections.Counter()
    for name, n in re.findall(r"<title>([^<(]+?) \([^<]*?\) \(([\d,]+) samples", text):
        if name.strip() not in OUTER:
            counts[name.strip()] += int(n.replace(",", ""))
    lines = [f"  {100 * n / total:5.1f}%  {name}" for name, n in counts.most_common(top)] if total else []
    return f"{svg.name}: {total} samples\n" + "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", default="before", help="docs/flame-<label>-<name>.svg")
    parser.add_argument("--targets", default=DEFAULT, help=f"name=target,... (default {DEFAULT})")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--out-dir", type=Path, default=bench.ROOT / "docs")
    args = parser.parse_args()
    pairs = [item.split("=", 1) for item in args.targets.split(",")]
    with bench.Lab() as lab:
        for name, target in pairs:
            if target not in bench.TARGETS:
                raise SystemExit(f"unknown target {target}; known: {', '.join(bench.TARGETS)}")
            out = args.out_dir / f"flame-{args.label}-{name}.svg"
            record(lab, target, out, args.seconds, args.connections)
            print(summary(out), flush=True)


if __name__ == "__main__":
    main()
