-- Takes a permit if fewer than the permits are held, in one round trip. With the queue keys
-- (a fair semaphore), free permits go to the first live waiters in the queue (this caller,
-- or others: they are handed over to them now), and a caller that will wait and does not get
-- one queues for it.
-- KEYS as in the prelude, then KEYS[5] (optional) the queue and KEYS[6] (with KEYS[5]) its
-- entries; ARGV[1] owner digest, ARGV[2] TTL in ms, ARGV[3] permits, ARGV[4] fence counter
-- TTL in ms, ARGV[5] release channel, and with the queue: ARGV[6] '1' to queue on
-- contention, '' not to (a try), ARGV[7] the name its grant is announced under and ARGV[8]
-- the channel ('' for none), ARGV[9] the mutex key of the semaphore's name.
-- Returns {1, fencing token} when granted (also to a retry of the same owner, whose permit
-- is then extended to the TTL), {0, ms until the first holder expires} when full,
-- {2, permits recorded} when the holders agreed on another count.
local now = now_ms()
local owner = ARGV[1]
local ttl = tonumber(ARGV[2])
local fence_ttl = tonumber(ARGV[4])
local queue, entries = KEYS[5], KEYS[6]
if prune(now) > 0 then
  publish(ARGV[5], '')
end
local asked = tonumber(ARGV[3])
if redis.call('ZCARD', KEYS[1]) > 0 then
  local recorded = tonumber(redis.call('GET', KEYS[3]))
  if recorded and recorded ~= asked then
    return {2, recorded}
  end
  local token = regrant(owner, ttl, fence_ttl, now)
  if token then
    if queue then
      leave(queue, entries, owner)
    end
    return {1, token}
  end
end
if queue and redis.call('ZCARD', KEYS[1]) < asked then
  -- Permits that holders left by expiring go to the queue, not to whoever asks first.
  redis.call('SET', KEYS[3], ARGV[3])
  hand_over_permits(queue, entries, asked, owner, fence_ttl, ARGV[9], now)
  keep(now)
end
if redis.call('ZCARD', KEYS[1]) >= asked then
  if queue and ARGV[6] == '1' then
    enqueue(queue, entries, owner, ttl, ARGV[7], ARGV[8], '', now)
  end
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, math.max(0, tonumber(first[2]) - now)}
end
local token = admit(owner, ttl, fence_ttl, now)
redis.call('SET', KEYS[3], ARGV[3])
keep(now)
return {1, token}
