-- Takes a permit if fewer than the permits are held, in one round trip.
-- KEYS as in the prelude, KEYS[4] the semaphore's fence counter;
-- ARGV[1] owner digest, ARGV[2] TTL in ms, ARGV[3] permits, ARGV[4] fence counter TTL in ms,
-- ARGV[5] release channel.
-- Returns {1, fencing token} when granted (also to a retry of the same owner, whose permit
-- is then extended to the TTL), {0, ms until the first holder expires} when full,
-- {2, permits recorded} when the holders agreed on another count.
local now = now_ms()
local ttl = tonumber(ARGV[2])
if prune(now) > 0 then
  publish(ARGV[5], '')
end
local asked = tonumber(ARGV[3])
if redis.call('ZCARD', KEYS[1]) > 0 then
  local recorded = tonumber(redis.call('GET', KEYS[3]))
  if recorded and recorded ~= asked then
    return {2, recorded}
  end
  local token = redis.call('HGET', KEYS[2], ARGV[1])
  if token and redis.call('ZSCORE', KEYS[1], ARGV[1]) then
    redis.call('ZADD', KEYS[1], 'XX', string.format('%d', now + ttl), ARGV[1])
    keep(now)
    keep_fence(math.max(ttl, tonumber(ARGV[4])))
    return {1, tonumber(token)}
  end
  if redis.call('ZCARD', KEYS[1]) >= asked then
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return {0, math.max(0, tonumber(first[2]) - now)}
  end
end
-- As for the mutex: the larger of the counter plus one and the server clock in
-- microseconds, so tokens keep increasing after the counter expires or is lost.
local t = redis.call('TIME')
local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
local token = redis.call('INCR', KEYS[4])
if token < clock then
  token = clock
  redis.call('SET', KEYS[4], string.format('%d', token))
end
keep_fence(math.max(ttl, tonumber(ARGV[4])))
redis.call('ZADD', KEYS[1], string.format('%d', now + ttl), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], string.format('%d', token))
redis.call('SET', KEYS[3], ARGV[3])
keep(now)
return {1, token}
