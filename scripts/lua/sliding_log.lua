--[[ sliding_log: an exact sliding window, a sorted set of request times per key.

Key:    <prefix><zone>:<key>  (with the hash tag of count keys on a cluster)
Value:  a sorted set: one member per logged request (the request's unique id),
        scored by its time in ms; at most `limit` members, since a rejected
        request is not logged and entries older than the window are removed first.
Expiry: one window after the last logged request.

  EVALSHA <sha> 1 <key> <now_ms> <limit> <window_ms> <member>
Reply: {limited (0/1), limit, remaining, retry_after_s, reset_s}
       (seconds rounded up; retry_after -1 when allowed)
]]

local function log_seconds(ms)
  return math.ceil(ms / 1000)
end

-- limited, the five reply fields (whether or not it is committed)
local function log_peek(key, now, limit, window_ms)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window_ms)
  local n = redis.call('ZCARD', key)
  if n >= limit then
    local oldest = tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2])
    local newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
    return true, {1, limit, 0, log_seconds(oldest + window_ms - now), log_seconds(newest + window_ms - now)}
  end
  return false, {0, limit, limit - n - 1, -1, log_seconds(window_ms)}
end

local function log_commit(key, now, window_ms, member)
  redis.call('ZADD', key, now, member)
  redis.call('PEXPIRE', key, window_ms)
end

-- The interface request.lua and undo.lua call (through the tables --#algos builds, see
-- gateway/store/lua.py): peek returns limited, the 8 reply fields of request.lua, and what
-- commit stores (nil: nothing) with one extra value; undo takes an undo kind after its letter.
local function sliding_log_algo_peek(key, now, p1, p2, p3, cost)
  local limited, reply = log_peek(key, now, p1, p2)
  reply[6], reply[7], reply[8] = 0, '', ''
  return limited, reply, 0, nil
end

local function sliding_log_algo_commit(key, now, store, extra, p1, p2, p3, member)
  log_commit(key, now, p2, member)
end

--#entry
local key = KEYS[1]
local now, limit, window_ms = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local limited, reply = log_peek(key, now, limit, window_ms)
if not limited then
  log_commit(key, now, window_ms, ARGV[4])
end
return reply
