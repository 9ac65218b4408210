-- Takes the lock if it is free, in one round trip. With the queue keys, a free lock goes to
-- the first live waiter in the queue (this caller, or another: the lock is handed over to it
-- now), and a caller that will wait and does not get it queues for it.
-- KEYS[1] lock key, KEYS[2] fence key, KEYS[3] (optional) queue, KEYS[4] (with KEYS[3])
-- queue entries (all under one hash tag).
-- ARGV[1] owner token (hex), ARGV[2] TTL in ms, ARGV[3] fence key TTL in ms (the counter
-- lives at least as long as the lock; renewals keep it alive with the lock),
-- ARGV[4] the token to propose, or '' for the server clock in microseconds,
-- ARGV[5] (with the queue) '1' to queue on contention, '' not to (a try),
-- ARGV[6] the owner's digest and ARGV[7] the channel its grant is announced on ('' for none),
-- ARGV[8] its turn in the queue ('' : after the last one).
-- Returns {1, fencing token} when granted (also to a retry of the same owner whose reply was
-- lost, and to a waiter the lock was handed to), {0, remaining TTL of the holder in ms} when
-- contended.
local owner = ARGV[1]
local queued = KEYS[4] ~= nil
local held = redis.call('GET', KEYS[1])
if held then
  local token = token_of(held, owner)
  if token then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    if queued then
      leave(KEYS[3], KEYS[4], owner)
    end
    return {1, token}
  end
  if queued and ARGV[5] == '1' then
    enqueue(KEYS[3], KEYS[4], owner, ARGV[2], ARGV[6], ARGV[7], ARGV[8], now_ms())
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
if queued then
  local now = now_ms()
  local head, expiry, digest, inbox = pop_live_head(KEYS[3], KEYS[4], now)
  if head and head ~= owner then
    -- A holder that expired left the lock to the queue, not to whoever asks first.
    local life = grant_to(KEYS[1], KEYS[2], ARGV[3], ARGV[4], now, head, expiry, digest, inbox)
    if ARGV[5] == '1' then
      enqueue(KEYS[3], KEYS[4], owner, ARGV[2], ARGV[6], ARGV[7], ARGV[8], now)
    end
    return {0, life}
  end
  -- The caller was the first live waiter, or nobody was: taken out of the queue either way.
end
local token = next_token(KEYS[2], ARGV[2], ARGV[3], ARGV[4])
redis.call('SET', KEYS[1], owner .. ':' .. string.format('%d', token), 'PX', ARGV[2])
return {1, token}
