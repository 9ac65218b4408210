-- Deletes the lock whoever holds it (an operator breaking a stale lock) and tells the
-- waiters; with the queue keys, the lock goes to the first live waiter in the queue. The fence
-- counter stays, so fencing tokens keep increasing.
-- KEYS[1] lock key, KEYS[2] (optional) its election value key, KEYS[3] fence key,
-- KEYS[4] queue, KEYS[5] queue entries (KEYS[3..5] together or not at all);
-- ARGV[1] release channel, ARGV[2] '1' to tell the waiters also when the key is not there
-- (Redlock: its waiters listen on one node, which may have missed the holder's key),
-- ARGV[3] (with the queue) the fence key's TTL in ms and ARGV[4] the token to propose for the
-- next grant, or '' for the server clock. Returns 1 when the lock was there, 0 otherwise.
if KEYS[2] and KEYS[2] ~= '' then
  redis.call('DEL', KEYS[2])
end
local held = redis.call('DEL', KEYS[1]) == 1
if KEYS[5] then
  hand_over(KEYS[1], KEYS[3], KEYS[4], KEYS[5], ARGV[3], ARGV[4] or '')
end
if held or ARGV[2] == '1' then
  redis.call('PUBLISH', ARGV[1], '')
end
return held and 1 or 0
