--[[ request: every limit of one request in one call (keys in one slot).

The same rules as the embedded store, in one atomic step:
  1. limit_req zones in order: the first that rejects (BUSY, or FORBIDDEN while banned)
     stops the walk and nothing is charged (a BUSY in a zone with a ban starts the ban);
  2. limit_count zones: a rejection drops the limit_req charge too;
  3. both committed; limit_conn leases taken when there is no delay (or in dry run).
In dry run nothing is refused and each kind is charged as if the others passed.
Per-key arithmetic and state formats are those of limit_req.lua, limit_count.lua
and limit_conn.lua (included below), so OpenResty nodes share the limit_req keys.

KEYS: the req keys, then the count keys, then the conn keys (only those with a key)
(the per-request values come first in ARGV; the rest is fixed per route, and encoded once)
ARGV: now_ms, member, dry (0/1), n_req, n_count, n_conn, take_conn (0/1), lease_ms,
      then per req zone: rate_m, burst_m, delay_m, ban_s
      then per count zone: limit, window_ms
      then per conn zone: max
Reply: {rc, fail_index, fail_excess, ban_ms, delay_ms, delay_index,
        req excess x n_req, count_fail, used x n_count, reset_ms x n_count,
        conn_done, conn_fail, conn count x n_conn}
  rc: 1 OK, 2 BUSY, 3 FORBIDDEN; indexes are 1-based, 0 for none.
]]

--#include limit_req.lua
--#include limit_count.lua
--#include limit_conn.lua

local now = tonumber(ARGV[1])
local member = ARGV[2]
local dry = ARGV[3] == '1'
local n_req, n_count, n_conn = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local take_conn = ARGV[7] == '1'
local lease_ms = tonumber(ARGV[8])
local arg = 9

local rc, fail_index, fail_excess, ban_ms = 1, 0, 0, 0
local excesses = {}
local params = {}
for i = 1, n_req do
  local rate_m, burst_m = tonumber(ARGV[arg]), tonumber(ARGV[arg + 1])
  local delay_m, ban_s = tonumber(ARGV[arg + 2]), tonumber(ARGV[arg + 3])
  params[i] = {rate_m, delay_m}
  arg = arg + 4
  if rc == 1 then
    local excess, forbidden = req_peek(KEYS[i], rate_m, now)
    if forbidden == 1 then
      rc, fail_index, fail_excess = 3, i, excess
      ban_ms = redis.call('PTTL', KEYS[i])
    elseif excess > burst_m then
      rc, fail_index, fail_excess = 2, i, excess
      if ban_s > 0 then
        req_ban(KEYS[i], excess, now, ban_s)
        ban_ms = ban_s * 1000
      end
    else
      excesses[i] = excess
    end
  end
end

local count_fail = 0
local used, reset, ends, passed = {}, {}, {}, {}
local counting = rc == 1 or dry
for j = 1, n_count do
  local limit, window_ms = tonumber(ARGV[arg]), tonumber(ARGV[arg + 1])
  arg = arg + 2
  used[j], reset[j] = -1, -1
  if counting then
    local key = KEYS[n_req + j]
    local u, window_end = count_peek(key, now, window_ms)
    reset[j] = window_end - now
    ends[j] = window_end
    if u + 1 > limit then
      used[j] = u
      if count_fail == 0 then
        count_fail = j
      end
      if not dry then
        counting = false
      end
    else
      used[j] = u + 1
      passed[j] = true
    end
  end
end

local req_ok = rc == 1 and (count_fail == 0 or dry)
local delay_ms, delay_index = 0, 0
if req_ok then
  -- nginx starts from the last zone's delay; an earlier zone wins only with a longer one
  for i = n_req, 1, -1 do
    req_accept(KEYS[i], excesses[i], now)
    local delay_m = params[i][2]
    local d = 0
    if excesses[i] > delay_m then
      d = math.floor((excesses[i] - delay_m) * 1000 / params[i][1])
    end
    if delay_index == 0 or d > delay_ms then
      delay_ms, delay_index = d, i
    end
  end
end
if (rc == 1 and count_fail == 0) or dry then
  for j = 1, n_count do
    if passed[j] then
      count_commit(KEYS[n_req + j], used[j], ends[j], now)
    end
  end
end

local conn_done, conn_fail = 0, 0
local counts = {}
if take_conn and ((rc == 1 and count_fail == 0) or dry) and (delay_ms == 0 or dry) then
  conn_done = 1
  for k = 1, n_conn do
    local key = KEYS[n_req + n_count + k]
    local taken, count = conn_take(key, tonumber(ARGV[arg + k - 1]), now, lease_ms, member)
    counts[k] = count
    if taken == 0 then
      conn_fail = k
      for back = 1, k - 1 do
        redis.call('ZREM', KEYS[n_req + n_count + back], member)
      end
      break
    end
  end
end

local reply = {rc, fail_index, fail_excess, ban_ms, delay_ms, delay_index}
for i = 1, n_req do
  reply[#reply + 1] = excesses[i] or -1
end
reply[#reply + 1] = count_fail
for j = 1, n_count do
  reply[#reply + 1] = used[j]
end
for j = 1, n_count do
  reply[#reply + 1] = reset[j]
end
reply[#reply + 1] = conn_done
reply[#reply + 1] = conn_fail
for k = 1, n_conn do
  reply[#reply + 1] = counts[k] or -1
end
return reply
