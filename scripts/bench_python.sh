#!/bin/bash
# The same work on two Python interpreters, in one run: which build to run the gateway on.
#
#   scripts/bench_python.sh PYTHON_A PYTHON_B [rounds]
#
# Each PYTHON is a venv's python with this project installed (pip install -e ".[speedups,bench]").
# Targets, all pinned to CPU 0 (the upstream nginx `return 200`, wrk -c50 and Redis on CPU 1):
#   bare_A, bare_B   scripts/baseline_proxy.py (aiohttp + uvloop, no limits) on each interpreter
#   req_A, req_B     the gateway with limit_req on Redis (as in ../shared/bench/compare.sh)
# Rounds alternate between the four; prints each round, the medians and B / A.
# Needs nginx, redis-server and wrk.
set -u
[ $# -ge 2 ] || { sed -n 2,11p "$0"; exit 2; }
A=$1; B=$2; rounds=${3:-5}
root=$(cd "$(dirname "$0")/.." && pwd); work=$(mktemp -d)
fp() { $A -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up=$(fp); rport=$(fp); ba=$(fp); bb=$(fp); ga=$(fp); gb=$(fp)
cat > "$work/up.conf" <<NG
worker_processes 1; daemon off; pid $work/up.pid; error_log $work/up.err warn;
events { worker_connections 4096; }
http { access_log off; server { listen 127.0.0.1:$up backlog=4096; keepalive_requests 1000000; location / { return 200 "ok\n"; } } }
NG
gw() {  # gw PORT REDIS_DB
  printf '%s\n' "listen: 127.0.0.1:$1" "workers: 1" "log: {access: off}" "admin: {listen: off}" \
    "store: {redis: {url: redis://127.0.0.1:$rport/$2}}" "zones:" \
    "  ip: {type: req, key: \$binary_remote_addr, rate: 1000000r/s}" \
    "upstreams:" "  app: {servers: [127.0.0.1:$up], keepalive: 64}" "routes:" "  - location: /" "    upstream: app" \
    "    limit_req: [{zone: ip, burst: 1000000, nodelay: true}]"
}
gw "$ga" 1 > "$work/ga.yaml"; gw "$gb" 2 > "$work/gb.yaml"
pids=()
taskset -c 1 redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no >/dev/null & pids+=($!)
taskset -c 1 nginx -c "$work/up.conf" & pids+=($!)
taskset -c 0 "$A" "$root/scripts/baseline_proxy.py" "$ba" "127.0.0.1:$up" & pids+=($!)
taskset -c 0 "$B" "$root/scripts/baseline_proxy.py" "$bb" "127.0.0.1:$up" & pids+=($!)
taskset -c 0 "$A" -m gateway run -c "$work/ga.yaml" > "$work/ga.out" 2>&1 & pids+=($!)
taskset -c 0 "$B" -m gateway run -c "$work/gb.yaml" > "$work/gb.out" 2>&1 & pids+=($!)
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
names=(bare_A bare_B req_A req_B)
declare -A port=([bare_A]=$ba [bare_B]=$bb [req_A]=$ga [req_B]=$gb) all
for n in "${names[@]}"; do  # up and answering 200, within 60 s
  for _ in $(seq 120); do
    code=$(curl -s -o /dev/null -w "%{http_code}" "http://127.0.0.1:${port[$n]}/") && [ "$code" = 200 ] && break
    sleep 0.5
  done
  [ "$code" = 200 ] || { echo "$n answers $code"; cat "$work"/*.out; exit 1; }
done
echo "A: $("$A" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
echo "B: $("$B" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
for round in $(seq "$rounds"); do
  line="round $round:"
  for n in "${names[@]}"; do
    v=$(taskset -c 1 wrk -t1 -c50 -d4s "http://127.0.0.1:${port[$n]}/" 2>/dev/null | awk '/Requests\/sec/ {print $2}')
    all[$n]+="$v "; line+=" $n=$v"
  done
  echo "$line"
done
med() { echo "$1" | tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
declare -A m
for n in "${names[@]}"; do m[$n]=$(med "${all[$n]}"); printf '  %-8s %s req/s (median)\n' "$n" "${m[$n]}"; done
awk -v a="${m[bare_A]}" -v b="${m[bare_B]}" 'BEGIN {printf "  bare proxy          B / A = %.3f\n", b / a}'
awk -v a="${m[req_A]}" -v b="${m[req_B]}" 'BEGIN {printf "  limit_req on Redis  B / A = %.3f\n", b / a}'
