--[[ gcra: redis-cell's CL.THROTTLE, with the same state in the key.

Key:    <prefix><zone>:<key>
Value:  the TAT, a decimal string of ns since the Unix epoch (redis-cell's format)
Expiry: PEXPIRE new_tat - now in whole ms (at least 1), set when a request passes.

Lua numbers are doubles, exact to 2^53: the script works relative to now (now is
whole ms, so now in ns is (now_ms, 0)), splitting the stored TAT into its ms and ns
parts. The gateway keeps tau under 2^53 ns (104 days), so every value is exact.

  EVALSHA <sha> 1 <key> <now_ms> <emission_ns> <burst> <quantity>
Reply: {limited (0/1), limit, remaining, retry_after_s, reset_after_s} as CL.THROTTLE
]]

local function gcra_trunc(x)
  if x < 0 then
    return -math.floor(-x)
  end
  return math.floor(x)
end

-- ns to redis-cell's seconds: whole seconds, plus one when at least 1 ms is left over
local function gcra_seconds(ns)
  local whole = math.floor(ns / 1e9)
  if ns - whole * 1e9 >= 1e6 then
    return whole + 1
  end
  return whole
end

-- the stored TAT relative to now, in ns (0 when missing or past)
local function gcra_tat(key, now)
  local raw = redis.call('GET', key)
  if not raw or not string.match(raw, '^%d+$') then
    return 0
  end
  local hi, lo = 0, tonumber(raw)
  if #raw > 6 then
    hi = tonumber(string.sub(raw, 1, -7))
    lo = tonumber(string.sub(raw, -6))
  end
  local rel = (hi - now) * 1e6 + lo
  if rel < 0 then
    return 0
  end
  return rel
end

-- decide without writing: limited, the five reply fields, the TAT to store (relative) or -1
local function gcra_peek(key, now, emission, burst, quantity)
  local tau = emission * (burst + 1)
  local increment = emission * quantity
  local tat = gcra_tat(key, now)
  local new_tat = tat + increment
  local limited = new_tat - tau > 0
  local retry, ttl, store = -1, new_tat, new_tat
  if limited then
    if increment <= tau then
      retry = gcra_seconds(new_tat - tau)
    end
    ttl, store = tat, -1
  end
  if increment == 0 then
    store = -1
  end
  local nxt = tau - ttl
  local remaining = 0
  if nxt > -emission then
    remaining = gcra_trunc(gcra_trunc(nxt / 1000) / gcra_trunc(emission / 1000))
  end
  local reply = {limited and 1 or 0, burst + 1, remaining, retry, gcra_seconds(ttl)}
  return limited, reply, store
end

local function gcra_commit(key, now, rel)
  local ms = math.floor(rel / 1e6)
  local value = string.format('%d%06d', now + ms, rel - ms * 1e6)
  redis.call('SET', key, value, 'PX', math.max(ms, 1))
end

-- take one request of quantity units back (undo on Redis Cluster): TAT - increment, not below now
local function gcra_undo(key, now, increment)
  local tat = gcra_tat(key, now)
  if tat > 0 then
    local rel = math.max(tat - increment, 0)
    if rel > 0 then
      local ms = math.floor(rel / 1e6)
      redis.call('SET', key, string.format('%d%06d', now + ms, rel - ms * 1e6), 'PX', math.max(ms, 1))
    else
      redis.call('DEL', key)
    end
  end
end

-- The interface request.lua and undo.lua call (through the tables --#algos builds, see
-- gateway/store/lua.py): peek returns limited, the 8 reply fields of request.lua, and what
-- commit stores (nil: nothing) with one extra value; undo takes an undo kind after its letter.
local function gcra_algo_peek(key, now, p1, p2, p3, cost)
  local limited, reply, store = gcra_peek(key, now, p1, p2, cost)
  reply[6], reply[7], reply[8] = 0, '', ''
  if store < 0 then
    store = nil
  end
  return limited, reply, store, nil
end

local function gcra_algo_commit(key, now, store, extra, p1, p2, p3, member)
  gcra_commit(key, now, store)
end

-- '<increment_ns>:<now_ms>': TAT - increment, not below now
local function gcra_algo_undo(key, arg, member)
  local increment, now = string.match(arg, '^(%d+):(%d+)$')
  if increment then
    gcra_undo(key, tonumber(now), tonumber(increment))
  end
end

--#entry
local key = KEYS[1]
local now = tonumber(ARGV[1])
local limited, reply, store = gcra_peek(key, now, tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]))
if store >= 0 then
  gcra_commit(key, now, store)
end
return reply
