--[[ ban_write: one batch of ban changes to the shared ban list (gateway/bans/redis.py).

KEYS: hash, expiry, version, log. ARGV: channel, log length, "+" (add) or "-" (remove), then
newline-separated targets and, to add, their JSON and their ends (few big arguments: cheap to send).
Writes the hash and the expiry index, bumps the version, appends the touched targets to the
log and publishes "<version>\n<JSON array of bans added>\n<removed target>..." on the channel.
Returns {version, target removed, ...}.
]]

local function lines(text)
  local out = {}
  for item in string.gmatch(text, '[^\n]+') do out[#out + 1] = item end
  return out
end
local targets = lines(ARGV[4])
local found = {}
local message
if ARGV[3] == '+' then
  local values, ends = lines(ARGV[5]), lines(ARGV[6])
  local fields, timed, forever = {}, {}, {}
  for i, target in ipairs(targets) do
    fields[#fields + 1] = target
    fields[#fields + 1] = values[i]
    if tonumber(ends[i]) > 0 then
      timed[#timed + 1] = ends[i]
      timed[#timed + 1] = target
    else
      forever[#forever + 1] = target
    end
  end
  if #fields > 0 then redis.call('HSET', KEYS[1], unpack(fields)) end
  if #timed > 0 then redis.call('ZADD', KEYS[2], unpack(timed)) end
  if #forever > 0 then redis.call('ZREM', KEYS[2], unpack(forever)) end
  message = '\n[' .. table.concat(values, ',') .. ']'
else
  for _, target in ipairs(targets) do
    if redis.call('HDEL', KEYS[1], target) == 1 then found[#found + 1] = target end
  end
  if #targets > 0 then redis.call('ZREM', KEYS[2], unpack(targets)) end
  message = '\n[]\n' .. ARGV[4]
end
if #targets == 0 then return {tonumber(redis.call('GET', KEYS[3]) or '0')} end
local version = redis.call('INCR', KEYS[3])
local id = version .. '-0'
if not pcall(redis.call, 'XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], id, 't', ARGV[4]) then
  -- the counter went back (deleted by hand): start the log again; nodes ahead of it re-read all
  redis.call('DEL', KEYS[4])
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], id, 't', ARGV[4])
end
redis.call('PUBLISH', ARGV[1], version .. message)
local out = {version}
for _, target in ipairs(found) do out[#out + 1] = target end
return out
