-- Shared by the semaphore scripts (prepended to each, after common.lua). One semaphore's keys,
-- all under its hash tag: KEYS[1] holders, a ZSET of owner digests scored by their expiry (ms by
-- this server's clock, so one clock decides); KEYS[2] tokens, a HASH owner digest -> fencing
-- token; KEYS[3] the permits count the holders agreed on; KEYS[4] the fence counter. The first
-- three live as long as the longest holder and go with the last one.

-- Removes the members of the ZSET `set` whose score (an expiry) is not after `now`, and their
-- fields in the HASH `hash` if one is given, in batches (`unpack` is bounded; a read-write
-- lock's readers are not); returns how many there were.
local function expire_members(set, hash, now)
  local expired = redis.call('ZRANGEBYSCORE', set, '-inf', string.format('%d', now))
  for i = 1, #expired, 1000 do
    local last = math.min(i + 999, #expired)
    redis.call('ZREM', set, unpack(expired, i, last))
    if hash then
      redis.call('HDEL', hash, unpack(expired, i, last))
    end
  end
  return #expired
end

-- Removes the expired holders; returns how many there were.
local function prune(now)
  return expire_members(KEYS[1], KEYS[2], now)
end

-- Keeps the keys alive as long as the longest holder; deletes them when there is none.
local function keep(now)
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
    return
  end
  local ms = string.format('%d', math.max(1, tonumber(last[2]) - now))
  for i = 1, 3 do
    redis.call('PEXPIRE', KEYS[i], ms)
  end
end

-- A retry by a live holder (its reply was lost): its grant is extended to `ttl` ms and its
-- token answered again. Nil when `owner` holds nothing.
local function regrant(owner, ttl, fence_ttl, now)
  local token = redis.call('HGET', KEYS[2], owner)
  if not (token and redis.call('ZSCORE', KEYS[1], owner)) then
    return nil
  end
  redis.call('ZADD', KEYS[1], 'XX', string.format('%d', now + ttl), owner)
  keep(now)
  keep_alive(KEYS[4], math.max(ttl, fence_ttl))
  return tonumber(token)
end

-- Makes `owner` a holder for `ttl` ms with the next fencing token (every grant takes the next
-- one), and returns the token. The caller keeps the keys alive (`keep`) once it has written
-- the rest of its grant.
local function admit(owner, ttl, fence_ttl, now)
  local token = next_token(KEYS[4], ttl, fence_ttl, '')
  redis.call('ZADD', KEYS[1], string.format('%d', now + ttl), owner)
  redis.call('HSET', KEYS[2], owner, string.format('%d', token))
  return token
end
