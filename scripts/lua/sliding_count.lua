--[[ sliding_count: APISIX limit-count's sliding window estimate (window_type: sliding).

Key:    <prefix><zone>:<key>  (with the hash tag of count keys on a cluster)
Value:  "<window_id>:<current>:<previous>"  (window_id = floor(now / window_ms))
Expiry: two windows; the expiry only collects garbage.

With rem = window_ms - now % window_ms and last = min(previous, limit), the
estimate is last / window_ms * rem + current. Rejected (nothing counted) when
current >= limit or the estimate >= limit; reset is rounded up to 10 ms.
The comparisons are in integers (limit * window_ms stays under 2^53).

  EVALSHA <sha> 1 <key> <limit> <window_ms> <now>
Reply: {allowed (1/0), remaining, reset_ms}
]]

local function sliding_counts(key, now, window_ms)
  local window_id = math.floor(now / window_ms)
  local raw = redis.call('GET', key)
  if raw then
    local id, current, previous = string.match(raw, '^(%d+):(%d+):(%d+)$')
    if id then
      id = tonumber(id)
      if id == window_id then
        return window_id, tonumber(current), tonumber(previous)
      elseif id == window_id - 1 then
        return window_id, 0, tonumber(current)
      end
    end
  end
  return window_id, 0, 0
end

local function sliding_ceil10(ms)
  return math.ceil(ms / 10) * 10
end

-- allowed (true/false), remaining, reset_ms, and the value to store when committed
local function sliding_peek(key, now, limit, window_ms)
  local window_id, current, previous = sliding_counts(key, now, window_ms)
  local rem = window_ms - now % window_ms
  local last = math.min(previous, limit)
  if current >= limit then
    return false, 0, sliding_ceil10(rem), nil
  end
  if last * rem + current * window_ms >= limit * window_ms then
    local reset = sliding_ceil10(rem)
    if last > 0 then
      -- rem - (limit - current) * window_ms / last, rounded up to 10 ms
      reset = math.max(0, math.ceil((rem * last - (limit - current) * window_ms) / (10 * last)) * 10)
    end
    return false, 0, reset, nil
  end
  current = current + 1
  local remaining = math.floor(((limit - current) * window_ms - last * rem) / window_ms)
  return true, remaining, sliding_ceil10(rem), string.format('%d:%d:%d', window_id, current, previous)
end

local function sliding_commit(key, value, window_ms)
  redis.call('SET', key, value, 'PX', 2 * window_ms)
end

--#entry
local key = KEYS[1]
local limit, window_ms, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local allowed, remaining, reset, value = sliding_peek(key, now, limit, window_ms)
if allowed then
  sliding_commit(key, value, window_ms)
  return {1, remaining, reset}
end
return {0, remaining, reset}
