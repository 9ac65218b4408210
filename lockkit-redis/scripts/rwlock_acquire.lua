-- Takes a read or the write lock in one round trip.
-- KEYS as in the prelude; ARGV[1] owner digest, ARGV[2] TTL in ms, ARGV[3] 'read' or
-- 'write', ARGV[4] '1' if the caller waits, ARGV[5] fence counter TTL in ms, ARGV[6] the
-- readers' channel, and for a writer that waits ARGV[7] the name its grant is announced
-- under and ARGV[8] the channel ('' for none); ARGV[9] the mutex key of the rwlock's name.
-- A reader is granted while no writer holds and none waits; a writer while nobody holds and
-- no writer waits ahead of it: a lock that its holders left by expiring goes to the first
-- waiting writer (handed over now), not to whoever asks first. A writer that is refused and
-- waits queues (each of its attempts refreshes its entry), which keeps new readers out; its
-- grant takes it out of the queue.
-- Returns {1, fencing token} when granted (also to a retry of the same owner, whose grant
-- is then extended to the TTL), {0, ms until the first of what keeps it out expires}.
local now = now_ms()
local ttl = tonumber(ARGV[2])
local owner = ARGV[1]
local writes = ARGV[3] == 'write'
local fence_ttl = tonumber(ARGV[5])
local writer, head, head_expiry = prune_all(now, ARGV[6])
local held = regrant(owner, ttl, fence_ttl, now)
if held then
  return {1, held}
end
local blocked_until = false
if writes then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if #first > 0 then
    blocked_until = tonumber(first[2])
  elseif head and head ~= owner then
    hand_over_write(fence_ttl, ARGV[9], now)
    keep(now)
    blocked_until = head_expiry
  end
else
  if writer then
    blocked_until = tonumber(redis.call('ZSCORE', KEYS[1], writer))
  end
  if head then
    blocked_until = math.min(blocked_until or head_expiry, head_expiry)
  end
end
if blocked_until then
  if writes and ARGV[4] == '1' then
    enqueue(KEYS[5], KEYS[6], owner, ttl, ARGV[7], ARGV[8], '', now)
  end
  return {0, math.max(0, blocked_until - now)}
end
-- Every grant, read or write, takes the next token: a write's is above every earlier grant's.
local token
if writes then
  leave(KEYS[5], KEYS[6], owner)
  token = admit_writer(owner, ttl, fence_ttl, now)
else
  token = admit(owner, ttl, fence_ttl, now)
end
keep(now)
return {1, token}
