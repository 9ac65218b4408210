-- Deletes the lock whoever holds it (an operator breaking a stale lock) and tells the
-- waiters. The fence counter stays, so fencing tokens keep increasing.
-- KEYS[1] lock key, KEYS[2] (optional) its election value key, KEYS[3] (optional) its
-- reservation key (the message names the waiter it is kept for, so that one wakes);
-- ARGV[1] release channel, ARGV[2] (optional) '1' to tell the waiters also when the key is
-- not there (Redlock: its waiters listen on one node, which may have missed the holder's
-- key). Returns 1 when the lock was there, 0 otherwise.
if KEYS[2] then
  redis.call('DEL', KEYS[2])
end
local reserved = KEYS[3] and redis.call('GET', KEYS[3])
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('PUBLISH', ARGV[1], reserved or '')
  return 1
end
if ARGV[2] == '1' then
  redis.call('PUBLISH', ARGV[1], '')
end
return 0
