-- Redlock: after a majority granted, raises this node's fence counter to the grant's token and
-- records the token in the lock value, so the next grant on this node gets a larger one.
-- KEYS[1] lock key, KEYS[2] fence key; ARGV[1] owner token (hex), ARGV[2] fencing token,
-- ARGV[3] fence key TTL in ms
-- Returns 1 when the lock is still ours on this node, 0 otherwise.
local token = tonumber(ARGV[2])
local counter = tonumber(redis.call('GET', KEYS[2]) or '0')
if counter < token then
  -- As long as the lock at least (its renewals keep the counter alive with it).
  local keep = math.max(tonumber(ARGV[3]), redis.call('PTTL', KEYS[1]))
  redis.call('SET', KEYS[2], ARGV[2], 'PX', keep)
end
local held = redis.call('GET', KEYS[1])
if held and token_of(held, ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1] .. ':' .. ARGV[2], 'KEEPTTL')
  return 1
end
return 0
