-- Extends the lock to its TTL if it is still ours, and keeps its fence counter alive with it.
-- KEYS[1] lock key, KEYS[2] fence key, KEYS[3] (optional) election value key (same hash
-- tag); ARGV[1] owner token (hex),
-- ARGV[2] TTL in ms, ARGV[3] fence key TTL in ms
-- Returns 1 when the lock was ours (and is extended), 0 otherwise.
local held = redis.call('GET', KEYS[1])
if held and token_of(held, ARGV[1]) then
  -- The counter outlives the lock by at least the fence TTL, so a lock held longer than
  -- that still hands the next holder a counted token, not a clock reading.
  keep_alive(KEYS[2], math.max(tonumber(ARGV[2]), tonumber(ARGV[3])))
  if KEYS[3] then
    -- No-op without a value; with one, it is this grant's (only the holder writes it, and
    -- every end of the grant deletes it or lets it expire with the lock).
    redis.call('PEXPIRE', KEYS[3], ARGV[2])
  end
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
