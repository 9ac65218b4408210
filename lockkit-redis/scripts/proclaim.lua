-- Elections: stores the value the holder of a grant proclaims, beside its lock, and tells the
-- observers. Only the holder of this very grant (owner and fencing token) may write it; the
-- value key lives exactly as long as the lock (renewals and releases keep them together).
-- KEYS[1] lock key, KEYS[2] value key (same hash tag); ARGV[1] owner token (hex),
-- ARGV[2] fencing token, ARGV[3] value, ARGV[4] release channel
-- Returns 1 when stored, 0 when the grant no longer holds the lock.
if redis.call('GET', KEYS[1]) ~= ARGV[1] .. ':' .. ARGV[2] then
  return 0
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl <= 0 then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2] .. ':' .. ARGV[3], 'PX', pttl)
publish(ARGV[4], 'proclaimed')
return 1
