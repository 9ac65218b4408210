-- Deletes the lock if it is still ours and tells the waiters, in one round trip.
-- KEYS[1] lock key, KEYS[2] (optional) its election value key, KEYS[3] (optional) its
-- reservation key; ARGV[1] owner token (hex), ARGV[2] release channel,
-- ARGV[3] (optional) '1' to tell the waiters also when the key is not there at all (Redlock:
-- its waiters listen on one node, which may have missed the holder's key),
-- ARGV[4] (with KEYS[3]) the owner's digest: its own reservation (a wait given up) goes too.
-- The message names the waiter the lock is reserved for (empty if none), so that one wakes.
-- Returns 1 when the lock was ours, 0 otherwise.
local held = redis.call('GET', KEYS[1])
local reserved = KEYS[3] and redis.call('GET', KEYS[3])
if reserved and reserved == ARGV[4] then
  redis.call('DEL', KEYS[3])
  reserved = false
  if not held then
    -- Others were kept out of the free lock for this waiter, which left.
    redis.call('PUBLISH', ARGV[2], '')
  end
end
if held and string.sub(held, 1, #ARGV[1] + 1) == ARGV[1] .. ':' then
  redis.call('DEL', KEYS[1])
  if KEYS[2] then
    redis.call('DEL', KEYS[2])
  end
  redis.call('PUBLISH', ARGV[2], reserved or '')
  return 1
end
if not held and ARGV[3] == '1' then
  redis.call('PUBLISH', ARGV[2], '')
end
return 0
