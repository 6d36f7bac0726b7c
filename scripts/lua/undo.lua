--[[ undo: take back what request.lua charged for one request (Redis Cluster only).

On a cluster a request's keys may sit in several slots, each evaluated by its own
request.lua call. When one group rejects the request while another committed it,
the committed group is undone here (like resty.limit.req's uncommit):
  r  limit_req key:   excess - 1000 (not below 0), last and expiry kept
  c  limit_count key: used - 1, window kept (sliding: the current window's count - 1)
  n  limit_conn key:  the request's lease removed
  g<increment_ns>:<now_ms>  gcra key: TAT - increment, not below now
  t<before>|<after>  token key: back to <before> if it still holds <after> (nothing else took a permit)
  (a zone type of limits: whose script defines <type>_algo_undo owns a letter: ALGO_UNDO,
  built by --#algos from the types' records, gateway/limits/<type>.py; sliding_log uses n)

  EVALSHA <sha> <n> <keys...> <member> <kind per key...>
]]

--#algos

local member = ARGV[1]
for i, key in ipairs(KEYS) do
  local kind = ARGV[i + 1]
  if kind == 'r' then
    local raw = redis.call('GET', key)
    if raw then
      local ok, state = pcall(cjson.decode, raw)
      if ok and type(state) == 'table' and #state >= 3 and state[3] == 0 then
        local excess = state[1] - 1000
        if excess < 0 then
          excess = 0
        end
        redis.call('SET', key, cjson.encode({excess, state[2], 0}), 'KEEPTTL')
      end
    end
  elseif kind == 'c' then
    local raw = redis.call('GET', key)
    if raw then
      local used, window_end = string.match(raw, '^(%d+):(%d+)$')
      local id, current, previous = string.match(raw, '^(%d+):(%d+):(%d+)$')
      if used and tonumber(used) > 0 then
        redis.call('SET', key, string.format('%d:%d', tonumber(used) - 1, tonumber(window_end)), 'KEEPTTL')
      elseif id and tonumber(current) > 0 then
        local value = string.format('%d:%d:%d', tonumber(id), tonumber(current) - 1, tonumber(previous))
        redis.call('SET', key, value, 'KEEPTTL')
      end
    end
  elseif kind == 'n' then
    redis.call('ZREM', key, member)
  else
    local undo = ALGO_UNDO[string.sub(kind, 1, 1)]
    if undo then
      undo(key, string.sub(kind, 2), member)
    end
  end
end
return #KEYS
