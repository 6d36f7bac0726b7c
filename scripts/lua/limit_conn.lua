--[[ limit_conn: concurrent requests per key, as leases in a sorted set.

Key:    <prefix><zone>:<key>   a sorted set; member = one request, score = lease end (ms)
A lease lasts lease_ms unless its node renews it (ZADD XX); a node that dies with
requests in flight loses their slots when their leases run out. Leases whose end
has passed are dropped when the set is full (only then can they change a decision;
the count reported may include them until then). The set expires 2 leases after it
is created; the renewal of its live leases pushes that expiry (ZADD XX + PEXPIRE).
Measured (scripts/redis_lua_cost.py): pruning and PEXPIRE on every take cost more
than the rest of the take; now a take is ZCARD + ZADD, and in one batch.lua call a
key's size is counted once (conn_sizes).

  EVALSHA <sha> 1 <key> <max> <now> <lease_ms> <member>
Reply: {taken (1/0), count including this request when taken}
Release: ZREM <key> <member>.
]]

-- batch.lua sets this to a table for one call: the sets' sizes it has counted, by key, kept
-- current through its takes and releases, so a key's many requests in one batch count it once.
local conn_sizes = nil

local function conn_size(key)
  local count = conn_sizes and conn_sizes[key]
  if not count then
    count = redis.call('ZCARD', key)
    if conn_sizes then
      conn_sizes[key] = count
    end
  end
  return count
end

local function conn_take(key, max, now, lease_ms, member)
  local count = conn_size(key)
  if count >= max then
    -- full: only now drop the leases that ran out (a dead node's), and count again
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    count = redis.call('ZCARD', key)
    if conn_sizes then
      conn_sizes[key] = count
    end
    if count >= max then
      return 0, count
    end
  end
  redis.call('ZADD', key, now + lease_ms, member)
  if count == 0 then
    -- a new set: it expires 2 leases after; renewals push that while it holds live leases
    redis.call('PEXPIRE', key, lease_ms * 2)
  end
  if conn_sizes then
    conn_sizes[key] = count + 1
  end
  return 1, count + 1
end

-- Give back `member`'s lease of `key`: the number removed (0 or 1).
local function conn_give_back(key, member)
  local removed = redis.call('ZREM', key, member)
  if conn_sizes and conn_sizes[key] then
    conn_sizes[key] = conn_sizes[key] - removed
  end
  return removed
end

--#entry
local taken, count = conn_take(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4])
return {taken, count}
