-- Gives a permit back if it is still held, and tells the waiters.
-- KEYS as in the prelude; ARGV[1] owner digest, ARGV[2] release channel.
-- Returns 1 when the permit was held (and is given back), 0 otherwise (also for a permit
-- that had expired: it is removed all the same). Expired holders found on the way go too,
-- and the waiters are told of them as well.
local now = now_ms()
local pruned = prune(now)
local ours = redis.call('ZREM', KEYS[1], ARGV[1]) == 1
if ours then
  redis.call('HDEL', KEYS[2], ARGV[1])
end
keep(now)
if ours or pruned > 0 then
  publish(ARGV[2], '')
end
if ours then
  return 1
end
return 0
