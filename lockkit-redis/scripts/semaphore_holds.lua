-- Whether a grant still holds its permit: the owner is a live holder with this very token.
-- KEYS as in the prelude; ARGV[1] owner digest, ARGV[2] fencing token.
-- Returns 1 or 0.
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now_ms() then
  return 0
end
if redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[2] then
  return 1
end
return 0
