-- Deletes the lock if it is still ours and tells the waiters, in one round trip. With the
-- queue keys, the lock is handed over to the first live waiter in the queue instead (see
-- `hand_over`), and the caller's own queue entry (a wait given up) goes.
-- KEYS[1] lock key, KEYS[2] (optional) its election value key, KEYS[3] fence key,
-- KEYS[4] queue, KEYS[5] queue entries (KEYS[3..5] together or not at all).
-- ARGV[1] owner token (hex), ARGV[2] release channel, ARGV[3] '1' to tell the waiters also
-- when the key is not there at all (Redlock: its waiters listen on one node, which may have
-- missed the holder's key), ARGV[4] (with the queue) the fence key's TTL in ms and ARGV[5]
-- the token to propose for the next grant, or '' for the server clock (see `next_token`).
-- The release channel hears of every release (election observers, waiters that do not queue).
-- Returns 1 when the lock was ours, 0 otherwise.
local owner = ARGV[1]
local queued = KEYS[5] ~= nil
if queued then
  leave(KEYS[4], KEYS[5], owner)
end
local held = redis.call('GET', KEYS[1])
if held and token_of(held, owner) then
  redis.call('DEL', KEYS[1])
  if KEYS[2] and KEYS[2] ~= '' then
    redis.call('DEL', KEYS[2])
  end
  if queued then
    hand_over(KEYS[1], KEYS[3], KEYS[4], KEYS[5], ARGV[4], ARGV[5] or '')
  end
  redis.call('PUBLISH', ARGV[2], '')
  return 1
end
if not held then
  -- A holder that expired left the lock to the queue.
  if queued and hand_over(KEYS[1], KEYS[3], KEYS[4], KEYS[5], ARGV[4], ARGV[5] or '') then
    redis.call('PUBLISH', ARGV[2], '')
  elseif ARGV[3] == '1' then
    redis.call('PUBLISH', ARGV[2], '')
  end
end
return 0
