--[[ ban_expire: remove the bans that have ended, through the expiry index (gateway/bans/redis.py).

KEYS: hash, expiry, version, log. ARGV: channel, log length, now_ms, limit.
Removes at most limit ended bans as one batch (version, log, publish as ban_write.lua does).
Returns how many ended.
]]

local ended = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[3], 'LIMIT', 0, tonumber(ARGV[4]))
if #ended == 0 then return 0 end
redis.call('HDEL', KEYS[1], unpack(ended))
redis.call('ZREM', KEYS[2], unpack(ended))
local version = redis.call('INCR', KEYS[3])
local id = version .. '-0'
if not pcall(redis.call, 'XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], id, 't', table.concat(ended, '\n')) then
  redis.call('DEL', KEYS[4])
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], id, 't', table.concat(ended, '\n'))
end
redis.call('PUBLISH', ARGV[1], version .. '\n[]\n' .. table.concat(ended, '\n'))
return #ended
