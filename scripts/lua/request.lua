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
      then per algo zone: its type's code and three parameters (each type's record,
           gateway/limits/<type>.py: gcra 1: emission_ns, burst, 0; sliding_log 2: limit,
           window_ms, 0; token 3: stable_us, warmup_us, max_delay_us)
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
--#include sliding_count.lua
-- the zone types of limits: (each one's script, and ALGOS: its code -> {peek, commit})
--#algos

-- batch.lua sets req_states to a table for one call: the limit_req states read or written
-- in it, by key, and req_dirty the keys written (with their expiry in seconds), in order.
-- A key's many requests in one batch (one busy client) then cost one GET and decode and one
-- SET at the end (req_flush) instead of a GET, a SET and an EXPIRE each. Alone (request.lua's
-- entry) both are nil: reads and writes go straight to Redis.
local req_states, req_dirty = nil, nil
local EMPTY = {}  -- stands for the tables of the kinds of limit a request does not have: never written

local function req_get(key, rate_m, now)
  if not req_states then
    return req_peek(key, rate_m, now)
  end
  local state = req_states[key]
  if state == nil then
    state = req_read(redis.call('GET', key)) or false
    req_states[key] = state
  end
  return req_level(state or nil, rate_m, now)
end

local function req_put(key, excess, now, forbidden, ttl_s)
  if not req_states then
    if forbidden == 1 then
      req_ban(key, excess, now, ttl_s)
    else
      req_accept(key, excess, now)
    end
    return
  end
  req_states[key] = {excess, now, forbidden}
  if not req_dirty[key] then
    req_dirty[#req_dirty + 1] = key
  end
  req_dirty[key] = ttl_s
end

-- The ban's remaining ms of a key found FORBIDDEN: a ban this batch started has all of it.
local function req_ban_left(key)
  if req_dirty and req_dirty[key] then
    return req_dirty[key] * 1000
  end
  return redis.call('PTTL', key)
end

-- Write the states this batch changed: what each request's own SET and EXPIRE would have left.
local function req_flush()
  for i = 1, #req_dirty do
    local key = req_dirty[i]
    redis.call('SET', key, cjson.encode(req_states[key]), 'EX', req_dirty[key])
  end
end

-- A route's fixed arguments (ARGV from dry on, see above) as numbers. batch.lua sends
-- each distinct one once per call and parses it once, whatever number of requests use it.
local function plan_of(ARGV, a)
  local p = {
    dry = ARGV[a + 1] == '1',
    n_req = tonumber(ARGV[a + 2]),
    n_count = tonumber(ARGV[a + 3]),
    n_conn = tonumber(ARGV[a + 4]),
    take_conn = ARGV[a + 5] == '1',
    lease_ms = tonumber(ARGV[a + 6]),
    n_algo = tonumber(ARGV[a + 7]),
    rate = {}, burst = {}, delay = {}, ban = {},
    limit = {}, window = {}, sliding = {},
    kind = {}, p1 = {}, p2 = {}, p3 = {},
    max = {},
  }
  local arg = a + 8
  for i = 1, p.n_req do
    p.rate[i], p.burst[i] = tonumber(ARGV[arg]), tonumber(ARGV[arg + 1])
    p.delay[i], p.ban[i] = tonumber(ARGV[arg + 2]), tonumber(ARGV[arg + 3])
    arg = arg + 4
  end
  for j = 1, p.n_count do
    p.limit[j], p.window[j], p.sliding[j] = tonumber(ARGV[arg]), tonumber(ARGV[arg + 1]), ARGV[arg + 2] == '1'
    arg = arg + 3
  end
  for x = 1, p.n_algo do
    p.kind[x], p.p1[x] = tonumber(ARGV[arg]), tonumber(ARGV[arg + 1])
    p.p2[x], p.p3[x] = tonumber(ARGV[arg + 2]), tonumber(ARGV[arg + 3])
    arg = arg + 4
  end
  for k = 1, p.n_conn do
    p.max[k] = tonumber(ARGV[arg + k - 1])
  end
  return p
end

-- One request's decision: its keys start after KEYS[k0] (batch.lua passes many requests'
-- in one call; alone, k0 = 0); now, member and costs are ARGV's first three, plan the rest.
local function request(KEYS, k0, now, member, cost_text, plan)
  local costs = EMPTY
  if cost_text ~= '' then
    costs = {}
    for cost in string.gmatch(cost_text, '%d+') do
      costs[#costs + 1] = tonumber(cost)
    end
  end
  local dry, take_conn, lease_ms = plan.dry, plan.take_conn, plan.lease_ms
  local n_req, n_count, n_conn, n_algo = plan.n_req, plan.n_count, plan.n_conn, plan.n_algo

  local rc, fail_index, fail_excess, ban_ms = 1, 0, 0, 0
  local excesses, rates, delays = {}, plan.rate, plan.delay
  for i = 1, n_req do
    local rate_m, burst_m, ban_s = rates[i], plan.burst[i], plan.ban[i]
    if rc == 1 then
      local excess, forbidden = req_get(KEYS[k0 + i], rate_m, now)
      if forbidden == 1 then
        rc, fail_index, fail_excess = 3, i, excess
        ban_ms = req_ban_left(KEYS[k0 + i])
      elseif excess > burst_m then
        rc, fail_index, fail_excess = 2, i, excess
        if ban_s > 0 then
          req_put(KEYS[k0 + i], excess, now, 1, ban_s)
          ban_ms = ban_s * 1000
        end
      else
        excesses[i] = excess
      end
    end
  end

  local count_fail = 0
  local used, reset, ends, passed, windows, slid = EMPTY, EMPTY, EMPTY, EMPTY, EMPTY, EMPTY
  if n_count > 0 then
    used, reset, ends, passed, windows, slid = {}, {}, {}, {}, {}, {}
  end
  local counting = rc == 1 or dry
  for j = 1, n_count do
    local limit, window_ms, sliding = plan.limit[j], plan.window[j], plan.sliding[j]
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
  local algo_replies, algo_store, algo_extra = EMPTY, EMPTY, EMPTY
  if n_algo > 0 then
    algo_replies, algo_store, algo_extra = {}, {}, {}
  end
  local algo_going = (rc == 1 and count_fail == 0) or dry
  local algo_base = n_req + n_count + n_conn
  local algo_delay = 0
  for a = 1, n_algo do
    if algo_going then
      local limited, reply, store, extra = ALGOS[plan.kind[a]].peek(KEYS[k0 + algo_base + a], now,
        plan.p1[a], plan.p2[a], plan.p3[a], costs[a])
      algo_replies[a] = reply
      if limited then
        if algo_fail == 0 then
          algo_fail = a
        end
        if not dry then
          algo_going = false
        end
      else
        if reply[6] > algo_delay then
          algo_delay = reply[6]  -- a token zone's wait
        end
        algo_store[a], algo_extra[a] = store, extra
      end
    end
  end
  local passed_all = rc == 1 and count_fail == 0 and algo_fail == 0

  local req_ok = rc == 1 and ((count_fail == 0 and algo_fail == 0) or dry)
  local delay_ms, delay_index = 0, 0
  if req_ok then
    -- nginx starts from the last zone's delay; an earlier zone wins only with a longer one.
    -- A zone's delay is what a lua-resty-redis-ratelimit node waits from the same state: its
    -- reply's excess truncated to an integer (as Redis does), divided by rate_m into seconds,
    -- and ngx.sleep truncates seconds * 1000 to whole ms (gateway/limits/resty_req.delay_ms).
    for i = n_req, 1, -1 do
      req_put(KEYS[k0 + i], excesses[i], now, 0, 60)
      local d = 0
      local whole = math.floor(excesses[i])
      if whole > delays[i] then
        d = math.floor((whole - delays[i]) / rates[i] * 1000)
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
      if algo_store[a] then
        ALGOS[plan.kind[a]].commit(KEYS[k0 + algo_base + a], now, algo_store[a], algo_extra[a],
          plan.p1[a], plan.p2[a], plan.p3[a], member)
      end
    end
  end

  local conn_done, conn_fail = 0, 0
  local counts = n_conn > 0 and {} or EMPTY
  if take_conn and (passed_all or dry) and ((delay_ms == 0 and algo_delay == 0) or dry) then
    conn_done = 1
    for k = 1, n_conn do
      local key = KEYS[k0 + n_req + n_count + k]
      local taken, count = conn_take(key, plan.max[k], now, lease_ms, member)
      counts[k] = count
      if taken == 0 then
        conn_fail = k
        for back = 1, k - 1 do
          conn_give_back(KEYS[k0 + n_req + n_count + back], member)
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
return request(KEYS, 0, tonumber(ARGV[1]), ARGV[2], ARGV[3], plan_of(ARGV, 3))
