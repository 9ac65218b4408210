-- Takes a permit if fewer than the permits are held, in one round trip.
-- KEYS as in the prelude; ARGV[1] owner digest, ARGV[2] TTL in ms, ARGV[3] permits, ARGV[4]
-- fence counter TTL in ms, ARGV[5] release channel.
-- Returns {1, fencing token} when granted (also to a retry of the same owner, whose permit
-- is then extended to the TTL), {0, ms until the first holder expires} when full,
-- {2, permits recorded} when the holders agreed on another count.
local now = now_ms()
local ttl = tonumber(ARGV[2])
local fence_ttl = tonumber(ARGV[4])
if prune(now) > 0 then
  publish(ARGV[5], '')
end
local asked = tonumber(ARGV[3])
if redis.call('ZCARD', KEYS[1]) > 0 then
  local recorded = tonumber(redis.call('GET', KEYS[3]))
  if recorded and recorded ~= asked then
    return {2, recorded}
  end
  local token = regrant(ARGV[1], ttl, fence_ttl, now)
  if token then
    return {1, token}
  end
  if redis.call('ZCARD', KEYS[1]) >= asked then
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return {0, math.max(0, tonumber(first[2]) - now)}
  end
end
local token = admit(ARGV[1], ttl, fence_ttl, now)
redis.call('SET', KEYS[3], ARGV[3])
keep(now)
return {1, token}
