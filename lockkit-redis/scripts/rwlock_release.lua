-- Gives a read or the write lock back, or removes a waiting writer's record (an abandoned
-- acquisition may have left either), and tells the waiters it concerns.
-- KEYS as in the prelude; ARGV[1] owner digest, ARGV[2] the readers' channel, ARGV[3] the
-- writers' channel.
-- Returns 1 when the owner held (and no longer does), 0 otherwise (also for a grant that
-- had expired: it is removed all the same). Expired holders and records found on the way
-- go too, and their waiters are told.
local now = now_ms()
local owner = ARGV[1]
local writer = prune_all(now, ARGV[2], ARGV[3])
local ours = redis.call('ZREM', KEYS[1], owner) == 1
if ours then
  redis.call('HDEL', KEYS[2], owner)
end
local wrote = ours and writer == owner
if wrote then
  redis.call('DEL', KEYS[3])
end
local waited = redis.call('ZREM', KEYS[5], owner) == 1
keep(now)
if ours then
  publish(ARGV[3], '')
end
if wrote or waited then
  publish(ARGV[2], '')
end
if ours then
  return 1
end
return 0
