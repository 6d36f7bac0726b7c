--[[ request: every limit of one request in one call (keys in one slot).

The same rules as the embedded store, in one atomic step:
  1. limit_req zones in order: the first that rejects (BUSY, or FORBIDDEN while banned)
     stops the walk and nothing is charged (a BUSY in a zone with a ban starts the ban);
  2. limit_count zones: a rejection drops the limit_req charge too;
  3. the zones of the newer algorithms (gcra), in order: a rejection drops both charges;
  4. all committed; limit_conn leases taken when there is no delay (or in dry run).
In dry run nothing is refused and each kind is charged as if the others passed.
Per-key arithmetic and state formats are those of limit_req.lua, limit_count.lua
limit_conn.lua and gcra.lua (included below), so OpenResty nodes share the limit_req keys.

KEYS: the req keys, then the count keys, then the conn keys, then the algo keys
      (only those with a key)
(the per-request values come first in ARGV; the rest is fixed per route, and encoded once)
ARGV: now_ms, member, costs (the algo zones' costs, comma-separated),
      dry (0/1), n_req, n_count, n_conn, take_conn (0/1), lease_ms, n_algo,
      then per req zone: rate_m, burst_m, delay_m, ban_s
      then per count zone: limit, window_ms, sliding (0/1)
      then per algo zone: type (1 gcra, 2 sliding_log, 3 token) and three parameters:
           gcra: emission_ns, burst, 0; sliding_log: limit, window_ms, 0;
           token: stable_us, warmup_us, max_delay_us
      then per conn zone: max
Reply: {rc, fail_index, fail_excess, ban_ms, delay_ms, delay_index,
        req excess x n_req, count_fail, used x n_count, reset_ms x n_count,
        conn_done, conn_fail, conn count x n_conn,
        algo_fail, then 8 fields x n_algo: limited, limit, remaining, retry_after_s, reset_s,
        delay_ms, then for token the key's value before and after ('' otherwise: undo.lua
        restores it on a cluster) (gcra: CL.THROTTLE's reply; -1 x 6 when not evaluated)}
  A token zone's delay holds back the limit_conn leases like a limit_req delay.
  rc: 1 OK, 2 BUSY, 3 FORBIDDEN; indexes are 1-based, 0 for none.
]]

--#include limit_req.lua
--#include limit_count.lua
--#include limit_conn.lua
--#include gcra.lua
--#include sliding_count.lua
--#include sliding_log.lua
--#include token.lua

-- One request's decision: its KEYS and ARGV as described above start after KEYS[k0] and
-- ARGV[a0] (batch.lua passes many requests' in one call; alone, k0 = a0 = 0).
local function request(KEYS, ARGV, k0, a0)
  local now = tonumber(ARGV[a0 + 1])
  local member = ARGV[a0 + 2]
  local costs = {}
  for cost in string.gmatch(ARGV[a0 + 3], '%d+') do
    costs[#costs + 1] = tonumber(cost)
  end
  local dry = ARGV[a0 + 4] == '1'
  local n_req, n_count, n_conn = tonumber(ARGV[a0 + 5]), tonumber(ARGV[a0 + 6]), tonumber(ARGV[a0 + 7])
  local take_conn = ARGV[a0 + 8] == '1'
  local lease_ms = tonumber(ARGV[a0 + 9])
  local n_algo = tonumber(ARGV[a0 + 10])
  local arg = 11

  local rc, fail_index, fail_excess, ban_ms = 1, 0, 0, 0
  local excesses = {}
  local params = {}
  for i = 1, n_req do
    local rate_m, burst_m = tonumber(ARGV[a0 + arg]), tonumber(ARGV[a0 + arg + 1])
    local delay_m, ban_s = tonumber(ARGV[a0 + arg + 2]), tonumber(ARGV[a0 + arg + 3])
    params[i] = {rate_m, delay_m}
    arg = arg + 4
    if rc == 1 then
      local excess, forbidden = req_peek(KEYS[k0 + i], rate_m, now)
      if forbidden == 1 then
        rc, fail_index, fail_excess = 3, i, excess
        ban_ms = redis.call('PTTL', KEYS[k0 + i])
      elseif excess > burst_m then
        rc, fail_index, fail_excess = 2, i, excess
        if ban_s > 0 then
          req_ban(KEYS[k0 + i], excess, now, ban_s)
          ban_ms = ban_s * 1000
        end
      else
        excesses[i] = excess
      end
    end
  end

  local count_fail = 0
  local used, reset, ends, passed = {}, {}, {}, {}
  local windows, slid = {}, {}
  local counting = rc == 1 or dry
  for j = 1, n_count do
    local limit, window_ms = tonumber(ARGV[a0 + arg]), tonumber(ARGV[a0 + arg + 1])
    local sliding = ARGV[a0 + arg + 2] == '1'
    arg = arg + 3
    used[j], reset[j] = -1, -1
    windows[j] = window_ms
    if counting and sliding then
      -- APISIX's estimate, reported as used = limit - remaining
      local allowed, remaining, rst, value = sliding_peek(KEYS[k0 + n_req + j], now, limit, window_ms)
      reset[j] = rst
      if allowed then
        used[j] = limit - math.max(0, remaining)
        passed[j], slid[j] = true, value
      else
        used[j] = limit
        if count_fail == 0 then
          count_fail = j
        end
        if not dry then
          counting = false
        end
      end
    elseif counting then
      local key = KEYS[k0 + n_req + j]
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

  local algo_fail = 0
  local algo_replies, algo_store = {}, {}
  local algo_going = (rc == 1 and count_fail == 0) or dry
  local algo_base = n_req + n_count + n_conn
  local algo_kind, algo_p, algo_expire = {}, {}, {}
  local algo_delay = 0
  local reply_before, reply_after
  for a = 1, n_algo do
    local kind = tonumber(ARGV[a0 + arg])
    local p1, p2, p3 = tonumber(ARGV[a0 + arg + 1]), tonumber(ARGV[a0 + arg + 2]), tonumber(ARGV[a0 + arg + 3])
    algo_kind[a], algo_p[a] = kind, p2
    arg = arg + 4
    if algo_going then
      local limited, reply, store
      reply_before, reply_after = '', ''
      if kind == 1 then
        limited, reply, store = gcra_peek(KEYS[k0 + algo_base + a], now, p1, p2, costs[a])
        reply[6] = 0
      elseif kind == 3 then
        reply_before = redis.call('GET', KEYS[k0 + algo_base + a]) or ''
        limited, reply, store, algo_expire[a] = token_peek(KEYS[k0 + algo_base + a], now, p1, p2, p3)
        reply_after = store or ''
        store = store or -1
        if not limited and reply[6] > algo_delay then
          algo_delay = reply[6]
        end
      else
        limited, reply = log_peek(KEYS[k0 + algo_base + a], now, p1, p2)
        reply[6] = 0
        store = 0
      end
      reply[7], reply[8] = reply_before, reply_after
      algo_replies[a] = reply
      if limited then
        if algo_fail == 0 then
          algo_fail = a
        end
        if not dry then
          algo_going = false
        end
      elseif kind == 3 or store >= 0 then
        algo_store[a] = store
      end
    end
  end
  local passed_all = rc == 1 and count_fail == 0 and algo_fail == 0

  local req_ok = rc == 1 and ((count_fail == 0 and algo_fail == 0) or dry)
  local delay_ms, delay_index = 0, 0
  if req_ok then
    -- nginx starts from the last zone's delay; an earlier zone wins only with a longer one
    for i = n_req, 1, -1 do
      req_accept(KEYS[k0 + i], excesses[i], now)
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
  if passed_all or dry then
    for j = 1, n_count do
      if slid[j] then
        sliding_commit(KEYS[k0 + n_req + j], slid[j], windows[j])
      elseif passed[j] then
        count_commit(KEYS[k0 + n_req + j], used[j], ends[j], now)
      end
    end
    for a = 1, n_algo do
      if algo_store[a] and algo_kind[a] == 1 then
        gcra_commit(KEYS[k0 + algo_base + a], now, algo_store[a])
      elseif algo_store[a] and algo_kind[a] == 3 then
        token_commit(KEYS[k0 + algo_base + a], algo_store[a], algo_expire[a])
      elseif algo_store[a] then
        log_commit(KEYS[k0 + algo_base + a], now, algo_p[a], member)
      end
    end
  end

  local conn_done, conn_fail = 0, 0
  local counts = {}
  if take_conn and (passed_all or dry) and ((delay_ms == 0 and algo_delay == 0) or dry) then
    conn_done = 1
    for k = 1, n_conn do
      local key = KEYS[k0 + n_req + n_count + k]
      local taken, count = conn_take(key, tonumber(ARGV[a0 + arg + k - 1]), now, lease_ms, member)
      counts[k] = count
      if taken == 0 then
        conn_fail = k
        for back = 1, k - 1 do
          redis.call('ZREM', KEYS[k0 + n_req + n_count + back], member)
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
  reply[#reply + 1] = algo_fail
  for a = 1, n_algo do
    local fields = algo_replies[a] or {-1, -1, -1, -1, -1, -1, '', ''}
    for f = 1, 8 do
      reply[#reply + 1] = fields[f]
    end
  end
  return reply
end

--#entry
return request(KEYS, ARGV, 0, 0)
