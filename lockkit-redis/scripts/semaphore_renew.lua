-- Extends a permit to its TTL if it is still held, keeping the semaphore's keys and fence
-- counter alive with it.
-- KEYS as in the prelude, KEYS[4] the fence counter; ARGV[1] owner digest, ARGV[2] TTL in
-- ms, ARGV[3] fence counter TTL in ms.
-- Returns 1 when the permit was held (and is extended), 0 otherwise.
local now = now_ms()
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now then
  return 0
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', string.format('%d', now + ttl), ARGV[1])
keep(now)
keep_fence(math.max(ttl, tonumber(ARGV[3])))
return 1
