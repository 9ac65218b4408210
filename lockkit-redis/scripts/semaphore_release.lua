-- Gives a permit back if it is still held, and tells the waiters. With the queue keys (every
-- release names them: fair waiters may queue whoever releases), the caller's own entry (a
-- wait given up) goes, and the permits free go to the first live waiters in the queue.
-- KEYS as in semaphore_acquire.lua; ARGV[1] owner digest, ARGV[2] release channel, and with
-- the queue ARGV[3] the fence counter's TTL in ms and ARGV[4] the mutex key of the
-- semaphore's name.
-- Returns 1 when the permit was held (and is given back), 0 otherwise (also for a permit
-- that had expired: it is removed all the same). Expired holders found on the way go too,
-- and the waiters are told of them as well.
local now = now_ms()
local pruned = prune(now)
local ours = redis.call('ZREM', KEYS[1], ARGV[1]) == 1
if ours then
  redis.call('HDEL', KEYS[2], ARGV[1])
end
local queue, entries = KEYS[5], KEYS[6]
if queue then
  leave(queue, entries, ARGV[1])
  -- The count lives with the holders: with none left before this release, the queue waits
  -- for its waiters' next attempts, which hand the permits over.
  local permits = tonumber(redis.call('GET', KEYS[3]))
  if permits then
    hand_over_permits(queue, entries, permits, nil, tonumber(ARGV[3]), ARGV[4], now)
  end
end
keep(now)
if ours or pruned > 0 then
  publish(ARGV[2], '')
end
if ours then
  return 1
end
return 0
