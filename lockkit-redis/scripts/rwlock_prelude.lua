-- Shared by the read-write lock's scripts, prepended to each after the semaphore's prelude
-- (whose now_ms, keep and keep_fence they use). One rwlock's keys, all under its hash tag:
-- KEYS[1] holders, a ZSET of owner digests scored by their expiry (ms by this server's
-- clock); KEYS[2] tokens, a HASH owner digest -> fencing token; KEYS[3] the writer, the
-- digest of the holder that writes (in the place of the semaphore's permits count, so
-- keep() keeps it with the holders); KEYS[4] the fence counter; KEYS[5] the waiting
-- writers, a ZSET of owner digests scored by the expiry of their record.

-- Removes the expired holders, in batches (readers are not bounded, and `unpack` is);
-- returns how many there were.
local function prune_holders(now)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
  for i = 1, #expired, 1000 do
    local last = math.min(i + 999, #expired)
    redis.call('ZREM', KEYS[1], unpack(expired, i, last))
    redis.call('HDEL', KEYS[2], unpack(expired, i, last))
  end
  return #expired
end

-- Removes the expired waiting writers' records; returns how many there were.
local function prune_waiting(now)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', string.format('%d', now))
  for i = 1, #expired, 1000 do
    redis.call('ZREM', KEYS[5], unpack(expired, i, math.min(i + 999, #expired)))
  end
  return #expired
end

-- The digest of the live holder that writes, or false; a marker left by a writer that is
-- no longer a holder goes.
local function live_writer()
  local writer = redis.call('GET', KEYS[3])
  if writer and redis.call('ZSCORE', KEYS[1], writer) then
    return writer
  end
  if writer then
    redis.call('DEL', KEYS[3])
  end
  return false
end

-- Keeps the waiting writers' records alive as long as the longest of them.
local function keep_waiting(now)
  local last = redis.call('ZRANGE', KEYS[5], -1, -1, 'WITHSCORES')
  if #last > 0 then
    redis.call('PEXPIRE', KEYS[5], string.format('%d', math.max(1, tonumber(last[2]) - now)))
  end
end

-- Drops what expired, telling those it concerns: the writers (who wait for every holder)
-- of expired holders, the readers (who wait for the writers) of an expired writer or
-- expired waiting writers. Returns the live writer, or false.
local function prune_all(now, readers_channel, writers_channel)
  local marked = redis.call('GET', KEYS[3])
  local holders = prune_holders(now)
  local writer = live_writer()
  local waiting = prune_waiting(now)
  if holders > 0 then
    publish(writers_channel, '')
  end
  if (marked and not writer) or waiting > 0 then
    publish(readers_channel, '')
  end
  return writer
end

