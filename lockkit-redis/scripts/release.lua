-- Deletes the lock if it is still ours and tells the waiters, in one round trip. With the
-- queue keys, the lock is handed over to the first live waiter in the queue instead (see
-- `hand_over`), and the caller's own queue entry (a wait given up) goes.
-- KEYS[1] lock key, KEYS[2] fence key, KEYS[3] queue, KEYS[4] queue entries (KEYS[2..4]
-- together or not at all), KEYS[5] (optional) the lock's election value key.
-- ARGV[1] owner token (hex), ARGV[2] release channel ('' for none): it hears of every release
-- and hand-over (election observers), ARGV[3] (with the queue) the fence key's TTL in ms and
-- ARGV[4] the token to propose for the next grant, or '' for the server clock (see
-- `next_token`), and optionally ARGV[5..8] a TTL in ms, digest, inbox and turn that put the
-- caller back in the queue before the hand-over (Redlock's rollback of a waiter's minority
-- grant: the lock goes to whoever is first, which may be the caller again).
-- Returns 1 when the lock was ours, 0 otherwise.
local owner = ARGV[1]
local queued = KEYS[4] ~= nil
local held = redis.call('GET', KEYS[1])
local ours = held and token_of(held, owner)
local changed = false
if ours then
  if KEYS[5] then
    redis.call('DEL', KEYS[5])
  end
  if queued and ARGV[5] then
    enqueue(KEYS[3], KEYS[4], owner, ARGV[5], ARGV[6], ARGV[7], ARGV[8], now_ms())
  end
  -- The hand-over overwrites the lock; with nobody queued it goes.
  if not (queued and hand_over(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[3], ARGV[4] or '')) then
    redis.call('DEL', KEYS[1])
  end
  changed = true
elseif queued then
  -- A wait given up: its entry goes. A lock free because its holder expired goes to the queue.
  leave(KEYS[3], KEYS[4], owner)
  if not held then
    changed = hand_over(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[3], ARGV[4] or '') ~= nil
  end
end
if changed and ARGV[2] ~= '' then
  publish(ARGV[2], '')
end
return ours and 1 or 0
