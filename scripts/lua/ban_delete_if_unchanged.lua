--[[ ban_delete_if_unchanged: delete hash fields that still hold the value read (gateway/bans/redis.py).

KEYS: hash. ARGV: field, value, field, value, ...
A full read deletes the ended entries it found without an expiry index, but only those an
operator has not banned again since. Returns 0.
]]

for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return 0
