-- Gives a read or the write lock back, or takes a waiting writer out of the queue (an
-- abandoned acquisition may have left either); a lock nobody holds then goes to the first
-- live waiting writer (handed over), else the readers are told a writer went.
-- KEYS as in the prelude; ARGV[1] owner digest, ARGV[2] the readers' channel, ARGV[3] the
-- fence counter's TTL in ms, ARGV[4] the mutex key of the rwlock's name.
-- Returns 1 when the owner held (and no longer does), 0 otherwise (also for a grant that
-- had expired: it is removed all the same). Expired holders and entries found on the way
-- go too, and the readers are told.
local now = now_ms()
local owner = ARGV[1]
local writer = prune_all(now, ARGV[2])
local ours = redis.call('ZREM', KEYS[1], owner) == 1
if ours then
  redis.call('HDEL', KEYS[2], owner)
end
local wrote = ours and writer == owner
if wrote then
  redis.call('DEL', KEYS[3])
end
local waited = leave(KEYS[5], KEYS[6], owner)
local handed = redis.call('ZCARD', KEYS[1]) == 0 and hand_over_write(tonumber(ARGV[3]), ARGV[4], now)
keep(now)
if (wrote or waited) and not handed then
  publish(ARGV[2], '')
end
if ours then
  return 1
end
return 0
