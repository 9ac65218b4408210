-- Shared by the read-write lock's scripts, prepended to each after queue.lua and the
-- semaphore's prelude (whose prune, keep, regrant and admit they use). One rwlock's keys, all
-- under its hash tag: KEYS[1] holders, a ZSET of owner digests scored by their expiry (ms by
-- this server's clock); KEYS[2] tokens, a HASH owner digest -> fencing token; KEYS[3] the
-- writer, the digest of the holder that writes (in the place of the semaphore's permits
-- count, so keep() keeps it with the holders); KEYS[4] the fence counter; KEYS[5] the
-- waiting writers, queue.lua's queue (members by owner digest), and KEYS[6] their entries.

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

-- Makes `owner` the holder that writes, for `ttl` ms; returns its token.
local function admit_writer(owner, ttl, fence_ttl, now)
  local token = admit(owner, ttl, fence_ttl, now)
  redis.call('SET', KEYS[3], owner)
  return token
end

-- Hands the lock, which nobody holds, to the first live waiting writer for what is left of
-- its entry, announced on its inbox as `name:token` (`lock`, the mutex key of the rwlock's
-- name, is what a Cluster's inbox channel carries). Returns whether one was waiting.
local function hand_over_write(fence_ttl, lock, now)
  local head, expiry, name, inbox = pop_live_head(KEYS[5], KEYS[6], now)
  if not head then
    return false
  end
  local token = admit_writer(head, expiry - now, fence_ttl, now)
  if inbox ~= '' then
    announce(inbox, lock, name .. ':' .. string.format('%d', token))
  end
  return true
end

-- Drops what expired: holders, the marker of a writer that went, the lapsed entries of
-- waiting writers ahead of the first live one; tells the readers (who wait for the writers)
-- when a writer's marker or entries went. Returns the live writer (or false), and the first
-- live waiting writer and when its entry lapses (or nil).
local function prune_all(now, readers_channel)
  local marked = redis.call('GET', KEYS[3])
  prune(now)
  local writer = live_writer()
  local queued = redis.call('ZCARD', KEYS[5])
  local head, expiry = live_head(KEYS[5], KEYS[6], now)
  if (marked and not writer) or redis.call('ZCARD', KEYS[5]) < queued then
    publish(readers_channel, '')
  end
  return writer, head, expiry
end
