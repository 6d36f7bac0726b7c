--[[ limit_conn: concurrent requests per key, as leases in a sorted set.

Key:    <prefix><zone>:<key>   a sorted set; member = one request, score = lease end (ms)
A lease lasts lease_ms unless its node renews it (ZADD XX); a node that dies with
requests in flight loses their slots when their leases run out. Leases whose end
has passed are dropped when the set is full (only then can they change a decision;
the count reported may include them until then). The set expires 2 leases after it
is created; the renewal of its live leases pushes that expiry (ZADD XX + PEXPIRE).
Measured (scripts/redis_lua_cost.py): pruning and PEXPIRE on every take cost more
than the rest of the take; now a take is ZCARD + ZADD.

  EVALSHA <sha> 1 <key> <max> <now> <lease_ms> <member>
Reply: {taken (1/0), count including this request when taken}
Release: ZREM <key> <member>.
]]

local function conn_take(key, max, now, lease_ms, member)
  local count = redis.call('ZCARD', key)
  if count >= max then
    -- full: only now drop the leases that ran out (a dead node's), and count again
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    count = redis.call('ZCARD', key)
    if count >= max then
      return 0, count
    end
  end
  redis.call('ZADD', key, now + lease_ms, member)
  if count == 0 then
    -- a new set: it expires 2 leases after; renewals push that while it holds live leases
    redis.call('PEXPIRE', key, lease_ms * 2)
  end
  return 1, count + 1
end

--#entry
local taken, count = conn_take(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4])
return {taken, count}
