--[[ limit_count: a fixed window per key, like resty.limit.count.

Key:    <prefix><zone>:<key>
Value:  "<used>:<window_end_ms>"   (the window starts at the key's first request)
Expiry: until the window ends, plus a second; the expiry only collects garbage,
        the decision uses the caller's clock and window_end.

  EVALSHA <sha> 1 <key> <limit> <window_ms> <now>
Reply: {allowed (1/0), used, ms left in the window}
A rejected request is not counted.
]]

local function count_peek(key, now, window_ms)
  local raw = redis.call('GET', key)
  if raw then
    local used, window_end = string.match(raw, '^(%d+):(%d+)$')
    if used then
      used = tonumber(used)
      window_end = tonumber(window_end)
      if now < window_end then
        return used, window_end
      end
    end
  end
  return 0, now + window_ms
end

local function count_commit(key, used, window_end, now)
  redis.call('SET', key, string.format('%d:%d', used, window_end), 'PX', math.max(window_end - now, 1) + 1000)
end

--#entry
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window_ms = tonumber(ARGV[2])
local now = tonumber(ARGV[3])

local used, window_end = count_peek(key, now, window_ms)
if used + 1 > limit then
  return {0, used, window_end - now}
end
count_commit(key, used + 1, window_end, now)
return {1, used + 1, window_end - now}
