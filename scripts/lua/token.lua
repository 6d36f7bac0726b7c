--[[ token: Guava's SmoothBursty / SmoothWarmingUp (cold factor 3), requests wait for permits.

The arithmetic of gateway/limits/token.py, step by step in the same order (doubles
on both sides, so both stores compute the same bits).

Key:    <prefix><zone>:<key>  (with the hash tag of count keys on a cluster)
Value:  "<stored permits>:<next_free_us>"  (%.17g: doubles round-trip exactly)
Expiry: until the bucket is full again, plus a second (a full bucket is a new key).

  EVALSHA <sha> 1 <key> <now_ms> <stable_us> <warmup_us> <max_delay_us>
Reply: {limited (0/1), 0, remaining, retry_after_s, reset_s, delay_ms}
       (the second field, the policy's quota, is filled in by the gateway)
]]

local function token_trunc(x)
  if x < 0 then
    return math.ceil(x)
  end
  return math.floor(x)
end

local function token_shape(stable, warmup)
  local cold = stable * 3.0
  local threshold, max_permits, slope, cool_down = 0.0, 1e6 / stable, 0.0, stable
  if warmup > 0 then
    threshold = 0.5 * warmup / stable
    max_permits = threshold + 2.0 * warmup / (stable + cold)
    slope = (cold - stable) / (max_permits - threshold)
    cool_down = warmup / max_permits
  end
  return threshold, max_permits, slope, cool_down
end

local function token_stored_wait(stable, warmup, threshold, slope, stored, take)
  if warmup <= 0 then
    return 0.0
  end
  local micros = 0.0
  local above = stored - threshold
  if above > 0.0 then
    local above_take = math.min(above, take)
    local length = (stable + above * slope) + (stable + (above - above_take) * slope)
    micros = token_trunc(above_take * length / 2.0)
    take = take - above_take
  end
  return micros + token_trunc(stable * take)
end

-- limited, the six reply fields, and the value to store when committed (nil when limited)
local function token_peek(key, now_ms, stable, warmup, max_delay)
  local now = now_ms * 1000.0
  local threshold, max_permits, slope, cool_down = token_shape(stable, warmup)
  local stored, next_free = max_permits, now
  local raw = redis.call('GET', key)
  local known = false
  if raw then
    local s, n = string.match(raw, '^([^:]+):([^:]+)$')
    if s and tonumber(s) and tonumber(n) then
      stored, next_free, known = tonumber(s), tonumber(n), true
    end
  end
  if known and next_free - max_delay > now then
    local retry_us = next_free - max_delay - now
    local held = stored
    if now > next_free then
      held = math.min(max_permits, stored + (now - next_free) / cool_down)
    end
    local refill = math.max(next_free - now, 0.0) + math.max(max_permits - stored, 0.0) * cool_down
    local reply = {1, 0, math.max(0, math.floor(held)), math.max(1, math.ceil(retry_us / 1e6)),
      math.ceil(refill / 1e6), 0}
    return true, reply, nil, 0
  end
  if now > next_free then
    stored = math.min(max_permits, stored + (now - next_free) / cool_down)
    next_free = now
  end
  local spend = math.min(1.0, stored)
  local fresh = 1 - spend
  local wait = token_stored_wait(stable, warmup, threshold, slope, stored, spend) + token_trunc(fresh * stable)
  local waiting = math.max(next_free - now, 0.0)
  stored = stored - spend
  next_free = next_free + wait
  local refill = math.max(next_free - now, 0.0) + math.max(max_permits - stored, 0.0) * cool_down
  local reply = {0, 0, math.max(0, math.floor(stored)), -1, math.ceil(refill / 1e6), math.ceil(waiting / 1000)}
  return false, reply, string.format('%.17g:%.17g', stored, next_free), math.ceil(refill / 1000) + 1000
end

local function token_commit(key, value, expire_ms)
  redis.call('SET', key, value, 'PX', expire_ms)
end

-- The interface request.lua and undo.lua call (through the tables --#algos builds, see
-- gateway/store/lua.py): peek returns limited, the 8 reply fields of request.lua, and what
-- commit stores (nil: nothing) with one extra value; undo takes an undo kind after its letter.
-- (fields 7 and 8: the key's value before and after, for undo.lua on a cluster)
local function token_algo_peek(key, now, p1, p2, p3, cost)
  local before = redis.call('GET', key) or ''
  local limited, reply, value, expire_ms = token_peek(key, now, p1, p2, p3)
  reply[7], reply[8] = before, value or ''
  return limited, reply, value, expire_ms
end

local function token_algo_commit(key, now, store, extra, p1, p2, p3, member)
  token_commit(key, store, extra)
end

-- '<before>|<after>': back to <before> if the key still holds <after> (nothing else took a permit)
local function token_algo_undo(key, arg, member)
  local before, after = string.match(arg, '^([^|]*)|(.+)$')
  if after and redis.call('GET', key) == after then
    if before == '' then
      redis.call('DEL', key)
    else
      redis.call('SET', key, before, 'KEEPTTL')
    end
  end
end

--#entry
local key = KEYS[1]
local limited, reply, value, expire_ms = token_peek(key, tonumber(ARGV[1]), tonumber(ARGV[2]),
  tonumber(ARGV[3]), tonumber(ARGV[4]))
if not limited then
  token_commit(key, value, expire_ms)
end
return reply
