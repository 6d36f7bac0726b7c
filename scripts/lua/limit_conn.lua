--[[ limit_conn: concurrent requests per key, as leases in a sorted set.

Key:    <prefix><zone>:<key>   a sorted set; member = one request, score = lease end (ms)
A lease lasts lease_ms unless its node renews it (ZADD XX); a node that dies with
requests in flight loses their slots when their leases run out. Leases whose end
has passed are dropped before counting.

  EVALSHA <sha> 1 <key> <max> <now> <lease_ms> <member>
Reply: {taken (1/0), count including this request when taken}
Release: ZREM <key> <member>.
]]

local function conn_take(key, max, now, lease_ms, member)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local count = redis.call('ZCARD', key)
  if count >= max then
    return 0, count
  end
  redis.call('ZADD', key, now + lease_ms, member)
  redis.call('PEXPIRE', key, lease_ms * 2)
  return 1, count + 1
end

--#entry
local taken, count = conn_take(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4])
return {taken, count}
