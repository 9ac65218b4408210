-- Shared by the read-write lock's scripts, prepended to each after the semaphore's prelude
-- (whose expire_members, prune, keep, regrant and admit they use). One rwlock's keys, all
-- under its hash tag: KEYS[1] holders, a ZSET of owner digests scored by their expiry (ms by this server's
-- clock); KEYS[2] tokens, a HASH owner digest -> fencing token; KEYS[3] the writer, the
-- digest of the holder that writes (in the place of the semaphore's permits count, so
-- keep() keeps it with the holders); KEYS[4] the fence counter; KEYS[5] the waiting
-- writers, a ZSET of owner digests scored by the expiry of their record.

-- Removes the expired waiting writers' records; returns how many there were.
local function prune_waiting(now)
  return expire_members(KEYS[5], nil, now)
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
  local holders = prune(now)
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

