--[[ ban_restore: put back bans a node still holds after Redis lost the list (gateway/bans/redis.py).

KEYS: hash, expiry, version, log, removed (sorted set: target scored by when it was unbanned).
ARGV: channel, log length, now_ms, how long removals are remembered (ms), then
newline-separated: removed targets, their removal times, then the bans to put back: targets,
JSON, created_ms, until_ms (few big arguments, as ban_write.lua).

The rule, the same whatever order the nodes run it in (each call is atomic):
* a removal known to any node wins over a ban created before it: it is recorded in the
  removed set, and deletes an entry of the hash created before it (put back by a node that
  did not hear of the removal);
* a ban is put back only if it has not ended, no recorded removal is as recent as its
  creation, and the hash holds no entry for it created at the same time or later (another
  node put it back already, or an operator banned it again since).
Then as ban_write.lua: the version, the log, one message. Returns {version, put back, deleted}.
]]

local function lines(text)
  local out = {}
  for item in string.gmatch(text, '[^\n]+') do out[#out + 1] = item end
  return out
end
local function created(value)
  local ok, ban = pcall(cjson.decode, value)
  if ok and type(ban) == 'table' and tonumber(ban['created_ms']) then return tonumber(ban['created_ms']) end
  return 0
end

local now, keep = tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', '(' .. (now - keep))
local gone, gone_at = lines(ARGV[5]), lines(ARGV[6])
local targets, values, made, ends = lines(ARGV[7]), lines(ARGV[8]), lines(ARGV[9]), lines(ARGV[10])
local deleted, added, touched = {}, {}, {}
for i, target in ipairs(gone) do
  local at = tonumber(gone_at[i])
  local known = tonumber(redis.call('ZSCORE', KEYS[5], target) or '0')
  if at > known then redis.call('ZADD', KEYS[5], at, target) end
  local value = redis.call('HGET', KEYS[1], target)
  if value and created(value) < at then
    redis.call('HDEL', KEYS[1], target)
    redis.call('ZREM', KEYS[2], target)
    deleted[#deleted + 1] = target
    touched[#touched + 1] = target
  end
end
for i, target in ipairs(targets) do
  local born, ends_at = tonumber(made[i]), tonumber(ends[i])
  local removed_at = tonumber(redis.call('ZSCORE', KEYS[5], target) or '-1')
  local value = redis.call('HGET', KEYS[1], target)
  if (ends_at == 0 or ends_at > now) and removed_at < born and not (value and created(value) >= born) then
    redis.call('HSET', KEYS[1], target, values[i])
    if ends_at > 0 then redis.call('ZADD', KEYS[2], ends_at, target) else redis.call('ZREM', KEYS[2], target) end
    added[#added + 1] = values[i]
    touched[#touched + 1] = target
  end
end
if #gone > 0 then redis.call('PEXPIRE', KEYS[5], keep) end
if #added == 0 and #deleted == 0 then return {tonumber(redis.call('GET', KEYS[3]) or '0'), 0, 0} end
local version = redis.call('INCR', KEYS[3])
local id = version .. '-0'
local t = table.concat(touched, '\n')
if not pcall(redis.call, 'XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], id, 't', t) then
  redis.call('DEL', KEYS[4])
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], id, 't', t)
end
local message = version .. '\n[' .. table.concat(added, ',') .. ']'
if #deleted > 0 then message = message .. '\n' .. table.concat(deleted, '\n') end
redis.call('PUBLISH', ARGV[1], message)
return {version, #added, #deleted}
