-- Takes the lock if it is free, in one round trip.
-- KEYS[1] lock key, KEYS[2] fence key, KEYS[3] (optional) reservation key (same hash tag)
-- ARGV[1] owner token (hex), ARGV[2] TTL in ms, ARGV[3] fence key TTL in ms (the counter
-- lives at least as long as the lock; renewals keep it alive with the lock),
-- ARGV[4] the token to propose, or '' for the server clock in microseconds,
-- ARGV[5] (with KEYS[3]) the owner's digest if this waiter has waited long enough to be
-- overtaken no more, else '': such a waiter reserves the lock, which is then free for it
-- alone (the reservation lives one TTL unless its waiter's next attempt renews it).
-- Returns {1, fencing token} when granted (also to a retry of the same owner whose reply was
-- lost), {0, remaining TTL of the holder (or of the reservation) in ms} when contended.
local held = redis.call('GET', KEYS[1])
local reserved = KEYS[3] and redis.call('GET', KEYS[3])
if held then
  if string.sub(held, 1, #ARGV[1] + 1) == ARGV[1] .. ':' then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    if reserved and reserved == ARGV[5] then
      redis.call('DEL', KEYS[3])
    end
    return {1, tonumber(string.sub(held, #ARGV[1] + 2))}
  end
  if KEYS[3] and ARGV[5] ~= '' and (not reserved or reserved == ARGV[5]) then
    redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[2])
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
if reserved then
  if reserved ~= ARGV[5] then
    return {0, redis.call('PTTL', KEYS[3])}
  end
  redis.call('DEL', KEYS[3])
end
-- The token is the larger of the counter plus one and a clock in microseconds (the proposed
-- one, or the server's), so it keeps increasing after the fence key expires or the data is
-- lost, unless that clock steps back.
local clock = tonumber(ARGV[4])
if not clock then
  local now = redis.call('TIME')
  clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
end
local token = redis.call('INCR', KEYS[2])
if token < clock then
  token = clock
  redis.call('SET', KEYS[2], string.format('%d', token))
end
redis.call('PEXPIRE', KEYS[2], math.max(tonumber(ARGV[2]), tonumber(ARGV[3])))
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. string.format('%d', token), 'PX', ARGV[2])
return {1, token}
