--[[ limit_req: a leaky bucket in Redis, compatible with lua-resty-redis-ratelimit.

Key:    <prefix><zone>:<key>   (the raw key: $binary_remote_addr is 4 or 16 bytes)
Value:  JSON [excess, last, forbidden]
          excess     milli-requests in the bucket (a float; cjson keeps 14 significant digits)
          last       the caller's clock in ms when the state was written
          forbidden  1 while the key is banned, else 0
Expiry: 60 s after every accepted request; `duration` seconds when a ban starts.

Called exactly as lua-resty-redis-ratelimit calls its script:
  EVALSHA <sha> 1 <zone:key> <rate_m> <burst_m> <now> <duration>
    rate_m    milli-requests per second, floor(N*1000/scale): 10r/s = 10000, 1r/m = 16
    burst_m   burst * 1000
    now       the caller's clock in ms (OpenResty sends ngx.now()*1000 as a %.14g string)
    duration  ban length in seconds, 0 for none
Reply: {state, excess}  state 1 = OK, 2 = BUSY (rejected), 3 = FORBIDDEN (banned);
       excess is the bucket level the decision saw (Redis truncates it to an integer).

The arithmetic (floating point, like the library):
  excess = max(0, excess - rate_m * |now - last| / 1000 + 1000)
  excess > burst_m  -> BUSY; nothing is written unless duration > 0, which bans the key
  otherwise         -> OK; [excess, now, 0] is stored
A key without state starts at excess 0. The functions above the entry marker are
also used by request.lua (the gateway's one-call-per-request script).
]]

-- The decoded state of a stored value: {excess, last, forbidden}, or nil for none (or not ours).
local function req_read(raw)
  if not raw then
    return nil
  end
  local ok, state = pcall(cjson.decode, raw)
  if not ok or type(state) ~= 'table' or #state < 3 then
    return nil
  end
  return state
end

-- Bucket level at `now` if one more request were accepted, and whether the key is banned.
local function req_level(state, rate_m, now)
  if not state then
    return 0, 0
  end
  if state[3] == 1 then
    return state[1], 1
  end
  local excess = state[1] - rate_m * math.abs(now - state[2]) / 1000 + 1000
  if excess < 0 then
    excess = 0
  end
  return excess, 0
end

-- The same, for `key` as stored now.
local function req_peek(key, rate_m, now)
  return req_level(req_read(redis.call('GET', key)), rate_m, now)
end

local function req_accept(key, excess, now)
  redis.call('SET', key, cjson.encode({excess, now, 0}))
  redis.call('EXPIRE', key, 60)
end

local function req_ban(key, excess, now, duration)
  redis.call('SET', key, cjson.encode({excess, now, 1}))
  redis.call('EXPIRE', key, duration)
end

--#entry
local key = KEYS[1]
local rate_m = tonumber(ARGV[1])
local burst_m = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local duration = tonumber(ARGV[4])

local excess, forbidden = req_peek(key, rate_m, now)
if forbidden == 1 then
  return {3, excess}
end
if excess > burst_m then
  if duration > 0 then
    req_ban(key, excess, now, duration)
  end
  return {2, excess}
end
req_accept(key, excess, now)
return {1, excess}
