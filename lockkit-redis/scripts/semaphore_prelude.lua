-- Shared by the semaphore scripts (prepended to each). One semaphore's keys, all under its
-- hash tag: KEYS[1] holders, a ZSET of owner digests scored by their expiry (ms by this
-- server's clock, so one clock decides); KEYS[2] tokens, a HASH owner digest -> fencing
-- token; KEYS[3] the permits count the holders agreed on. The three live as long as the
-- longest holder and go with the last one.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Removes the expired holders; returns how many there were.
local function prune(now)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
  if #expired > 0 then
    redis.call('ZREM', KEYS[1], unpack(expired))
    redis.call('HDEL', KEYS[2], unpack(expired))
  end
  return #expired
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

-- Keeps the fence counter (KEYS[4]) at least `ms` longer.
local function keep_fence(ms)
  if redis.call('PTTL', KEYS[4]) < ms then
    redis.call('PEXPIRE', KEYS[4], string.format('%d', ms))
  end
end

