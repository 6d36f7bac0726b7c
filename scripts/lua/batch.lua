--[[ batch: several requests' decisions, and lease upkeep, in one atomic call.

The gateway gathers what its requests ask of Redis in one event-loop tick (and while
the previous batch is on the wire) into one call of this script: one round trip and
one script call for many requests. The operations run in order, each exactly as
request.lua runs it alone, so the state formats (limit_req's JSON
[excess, last, forbidden] under <prefix><zone>:<key>, shared with OpenResty nodes)
and the rules are those of request.lua. On Redis Cluster every key of one batch is
in one slot: the gateway batches per slot.

KEYS: the keys of every operation, in order.
ARGV: n_ops, n_plans, then per plan: n_args and its n_args arguments (a route's fixed
  part of request.lua's ARGV, from dry on: sent and parsed once per call), then per
  operation: kind, n_keys, n_args, its n_args arguments
  kind 'q'  one request: args: plan (1-based), now_ms, member, costs; KEYS as request.lua's
  kind 'x'  limit_conn releases: ZREM key member, for each of its keys; args: member
  kind 'w'  limit_conn lease renewal of one key: args: until_ms, set_ttl_ms, members...
            (ZADD XX: a released lease is not brought back)
Reply: one entry per operation: request.lua's reply for 'q' (a string: a WRONGTYPE
error that stopped that request alone; any other error fails the whole call, so that
the client sees READONLY after a failover), the number of members changed for 'x'
and 'w'.

A key used by several operations of one call is read once: limit_req states are kept
decoded and written once at the end (req_states, in request.lua), limit_conn set sizes
are counted once (conn_sizes, in limit_conn.lua). Measured with scripts/redis_lua_cost.py.
]]

--#include request.lua

local replies = {}
req_states, req_dirty, conn_sizes = {}, {}, {}
local n_ops, plans = tonumber(ARGV[1]), {}
local k, a = 0, 3
for p = 1, tonumber(ARGV[2]) do
  plans[p] = plan_of(ARGV, a)
  a = a + 1 + tonumber(ARGV[a])
end
for op = 1, n_ops do
  local kind, n_keys, n_args = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
  if kind == 'q' then
    local ok, reply = pcall(request, KEYS, k, tonumber(ARGV[a + 1]), ARGV[a + 2], ARGV[a + 3], plans[tonumber(ARGV[a])])
    if not ok then
      local message = type(reply) == 'table' and reply.err or tostring(reply)
      if not string.find(message, 'WRONGTYPE', 1, true) then
        -- not this request's own (READONLY after a failover, OOM...): the whole call fails,
        -- with Redis' own message, so that the client sees READONLY and finds the new master
        return redis.error_reply(message)
      end
      reply = message
    end
    replies[op] = reply
  elseif kind == 'x' then
    local changed = 0
    for i = 1, n_keys do
      changed = changed + conn_give_back(KEYS[k + i], ARGV[a])
    end
    replies[op] = changed
  else
    local key, until_ms = KEYS[k + 1], ARGV[a]
    local zadd = {'ZADD', key, 'XX', 'CH'}
    for i = 2, n_args - 1 do
      zadd[#zadd + 1] = until_ms
      zadd[#zadd + 1] = ARGV[a + i]
    end
    replies[op] = redis.call(unpack(zadd))
    redis.call('PEXPIRE', key, ARGV[a + 1])
  end
  k, a = k + n_keys, a + n_args
end
req_flush()
return replies
