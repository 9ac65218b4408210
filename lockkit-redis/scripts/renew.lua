-- Extends the lock to its TTL if it is still ours.
-- KEYS[1] lock key; ARGV[1] owner token (hex), ARGV[2] TTL in ms
-- Returns 1 when the lock was ours (and is extended), 0 otherwise.
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #ARGV[1] + 1) == ARGV[1] .. ':' then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
