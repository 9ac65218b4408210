-- Deletes the lock whoever holds it (an operator breaking a stale lock) and tells the
-- waiters; with the queue keys, the lock goes to the first live waiter in the queue. The fence
-- counter stays, so fencing tokens keep increasing.
-- KEYS[1] lock key, KEYS[2] fence key, KEYS[3] queue, KEYS[4] queue entries (KEYS[2..4]
-- together or not at all), KEYS[5] (optional) the lock's election value key;
-- ARGV[1] release channel ('' for none), ARGV[2] (with the queue) the fence key's TTL in ms,
-- ARGV[3] the token to propose for the next grant, or '' for the server clock, and ARGV[4]
-- (optional) the lock's value as the operator read it ('' for none): the lock is broken only
-- while it still holds that value, so the script is safe to send again (a repeat that finds
-- the lock handed over to the next waiter leaves that waiter's grant alone).
-- Returns 1 when the lock was there and broken, 0 otherwise.
local held = redis.call('GET', KEYS[1])
if ARGV[4] and (held or '') ~= ARGV[4] then
  return 0
end
if KEYS[5] then
  redis.call('DEL', KEYS[5])
end
local broken = redis.call('DEL', KEYS[1]) == 1
local changed = broken
if KEYS[4] then
  changed = hand_over(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[3] or '') or changed
end
if changed and ARGV[1] ~= '' then
  publish(ARGV[1], '')
end
return broken and 1 or 0
