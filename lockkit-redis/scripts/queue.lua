-- Shared by the scripts of every kind whose waiters queue (prepended after common.lua): a
-- mutex's, a fair semaphore's, a read-write lock's writers. The waiters of one key queue in
-- two keys under its hash tag: a ZSET of members (a mutex's owner hexes, the others' owner
-- digests) scored by their turn (first come, first served on one server; on Redlock's
-- independent nodes, the time each acquisition began, which orders every node's queue
-- alike), and a HASH of each one's entry, `expiry name inbox`: when the entry lapses (ms by
-- this server's clock; each attempt of its waiter renews it for one TTL), the name its grant
-- is announced under (`digest/attempt`), and the pub/sub channel it is announced on. Both
-- keys live at least as long as their longest entry (at most two TTLs, so that a steady
-- queue rarely pays for their expiry), and go with the last one.

-- Takes `owner`'s entry out of the queue (Redis deletes a key whose last member goes);
-- whether it was queued.
local function leave(queue, entries, owner)
  if redis.call('ZREM', queue, owner) == 1 then
    redis.call('HDEL', entries, owner)
    return true
  end
  return false
end

-- Puts `owner` in the queue (at the back, or at its `turn` if that is not '') or renews its
-- entry (keeping its turn), for `ttl` ms.
local function enqueue(queue, entries, owner, ttl, name, inbox, turn, now)
  if turn and turn ~= '' then
    redis.call('ZADD', queue, 'NX', turn, owner)
  elseif not redis.call('ZSCORE', queue, owner) then
    local last = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES')[2]
    redis.call('ZADD', queue, (tonumber(last) or 0) + 1, owner)
  end
  redis.call('HSET', entries, owner, string.format('%d', now + ttl) .. ' ' .. name .. ' ' .. inbox)
  if redis.call('PTTL', queue) < tonumber(ttl) then
    redis.call('PEXPIRE', queue, 2 * ttl)
    redis.call('PEXPIRE', entries, 2 * ttl)
  end
end

-- The first waiter whose entry has not lapsed, with its entry's expiry, name and inbox (the
-- lapsed ones ahead of it are taken out of the queue); nil when there is none. However many
-- entries lapsed ahead of it: a live waiter is never passed over, and a lock never freed
-- without a hand-over while one waits. Each entry was put by one attempt and is taken out
-- once, so the work is O(1) per attempt over time, read 100 entries at a time.
local function live_head(queue, entries, now)
  while true do
    -- ZRANGE and ZREM rather than ZPOPMIN, HGET rather than HMGET: the ACL of README.md's
    -- lockkit user has neither, and would refuse every release.
    local batch = redis.call('ZRANGE', queue, 0, 99)
    if #batch == 0 then
      return nil
    end
    local lapsed = {}
    for _, owner in ipairs(batch) do
      local entry = redis.call('HGET', entries, owner)
      local expiry, name, inbox
      if entry then
        expiry, name, inbox = string.match(entry, '^(%d+) (%S+) (%S*)$')
        expiry = tonumber(expiry)
      end
      if expiry and expiry > now then
        if #lapsed > 0 then
          redis.call('ZREM', queue, unpack(lapsed))
          redis.call('HDEL', entries, unpack(lapsed))
        end
        return owner, expiry, name, inbox
      end
      lapsed[#lapsed + 1] = owner
    end
    redis.call('ZREM', queue, unpack(lapsed))
    redis.call('HDEL', entries, unpack(lapsed))
  end
end

-- Takes the first live waiter out of the queue (see `live_head`) and answers it as
-- `live_head` does.
local function pop_live_head(queue, entries, now)
  local head, expiry, name, inbox = live_head(queue, entries, now)
  if head then
    leave(queue, entries, head)
  end
  return head, expiry, name, inbox
end
