-- Takes a read or the write lock in one round trip.
-- KEYS as in the prelude; ARGV[1] owner digest, ARGV[2] TTL in ms, ARGV[3] 'read' or
-- 'write', ARGV[4] '1' if the caller waits, ARGV[5] fence counter TTL in ms, ARGV[6] the
-- readers' channel, ARGV[7] the writers' channel.
-- A reader is granted while no writer holds and none waits; a writer while nobody holds.
-- A writer that is refused and waits records itself among the waiting writers until
-- now + TTL (each of its attempts refreshes that), which keeps new readers out; its grant
-- removes the record.
-- Returns {1, fencing token} when granted (also to a retry of the same owner, whose grant
-- is then extended to the TTL), {0, ms until the first of what keeps it out expires}.
local now = now_ms()
local ttl = tonumber(ARGV[2])
local owner = ARGV[1]
local writes = ARGV[3] == 'write'
local writer = prune_all(now, ARGV[6], ARGV[7])
local fence_ttl = tonumber(ARGV[5])
local held = regrant(owner, ttl, fence_ttl, now)
if held then
  return {1, held}
end
local blocked_until = false
if writes then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if #first > 0 then
    blocked_until = tonumber(first[2])
  end
else
  if writer then
    blocked_until = tonumber(redis.call('ZSCORE', KEYS[1], writer))
  end
  local first = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
  if #first > 0 then
    blocked_until = math.min(blocked_until or tonumber(first[2]), tonumber(first[2]))
  end
end
if blocked_until then
  if writes and ARGV[4] == '1' then
    redis.call('ZADD', KEYS[5], string.format('%d', now + ttl), owner)
    keep_waiting(now)
  end
  return {0, math.max(0, blocked_until - now)}
end
-- Every grant, read or write, takes the next token: a write's is above every earlier grant's.
local token = admit(owner, ttl, fence_ttl, now)
if writes then
  redis.call('SET', KEYS[3], owner)
  if redis.call('ZREM', KEYS[5], owner) == 1 then
    keep_waiting(now)
  end
end
keep(now)
return {1, token}
