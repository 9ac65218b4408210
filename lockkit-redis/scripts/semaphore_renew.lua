-- Extends a permit (or a read or write lock) to its TTL if it is still held, keeping its
-- keys and fence counter alive with it.
-- KEYS[1] holders, KEYS[2] tokens, KEYS[3] the fence counter, KEYS[4] (optional) the key that
-- lives with the holders: a semaphore's permits count, a writer's marker. Only keys that
-- exist while the grant does: a read lock leaves the writer's marker out, since a Cluster
-- refuses a script that names a missing key for as long as its slot migrates.
-- ARGV[1] owner digest, ARGV[2] TTL in ms, ARGV[3] fence counter TTL in ms.
-- Returns 1 when the grant was held (and is extended), 0 otherwise.
local now = now_ms()
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now then
  return 0
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', string.format('%d', now + ttl), ARGV[1])
-- The keys live as long as the longest holder (this one at least).
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local ms = string.format('%d', math.max(1, tonumber(last[2]) - now))
for _, key in ipairs({KEYS[1], KEYS[2], KEYS[4]}) do
  redis.call('PEXPIRE', key, ms)
end
keep_alive(KEYS[3], math.max(ttl, tonumber(ARGV[3])))
return 1
