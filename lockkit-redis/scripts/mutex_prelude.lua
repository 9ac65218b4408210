-- Shared by the mutex scripts (prepended to each). A lock's value is `owner-hex:token`. Its
-- waiters queue in two keys under the lock's hash tag: a ZSET of owner hexes scored by their
-- turn (first come, first served on one server; on Redlock's independent nodes, the time
-- each acquisition began, which orders every node's queue alike), and a HASH of each one's
-- entry, `expiry digest inbox`: when the entry lapses (ms by this server's clock; each
-- attempt of its waiter renews it for one TTL), the waiter's owner digest, and the pub/sub
-- channel its grant is announced on. Both keys live at least as long as their longest entry
-- (at most two TTLs, so that a steady queue rarely pays for their expiry), and go with the
-- last one. (`now_ms`, `token_of` and `next_token` are common.lua's.)

-- Takes `owner`'s entry out of the queue (Redis deletes a key whose last member goes).
local function leave(queue, entries, owner)
  if redis.call('ZREM', queue, owner) == 1 then
    redis.call('HDEL', entries, owner)
  end
end

-- Puts `owner` in the queue (at the back, or at its `turn` if that is not '') or renews its
-- entry (keeping its turn), for `ttl` ms.
local function enqueue(queue, entries, owner, ttl, digest, inbox, turn, now)
  if turn and turn ~= '' then
    redis.call('ZADD', queue, 'NX', turn, owner)
  elseif not redis.call('ZSCORE', queue, owner) then
    local last = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES')[2]
    redis.call('ZADD', queue, (tonumber(last) or 0) + 1, owner)
  end
  redis.call('HSET', entries, owner, string.format('%d', now + ttl) .. ' ' .. digest .. ' ' .. inbox)
  if redis.call('PTTL', queue) < tonumber(ttl) then
    redis.call('PEXPIRE', queue, 2 * ttl)
    redis.call('PEXPIRE', entries, 2 * ttl)
  end
end

-- Takes the first waiter whose entry has not lapsed out of the queue (lapsed ones ahead of it
-- go too), and answers it with its entry's expiry, digest and inbox; nil when there is none.
-- However many entries lapsed ahead of it: a live waiter is never passed over, and a lock
-- never freed without a hand-over while one waits. Each entry was put by one attempt and is
-- taken out once, so the work is O(1) per attempt over time, read 100 entries at a time.
local function pop_live_head(queue, entries, now)
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
      local expiry, digest, inbox
      if entry then
        expiry, digest, inbox = string.match(entry, '^(%d+) (%S+) (%S*)$')
        expiry = tonumber(expiry)
      end
      if expiry and expiry > now then
        if #lapsed > 0 then
          redis.call('ZREM', queue, unpack(lapsed))
          redis.call('HDEL', entries, unpack(lapsed))
        end
        leave(queue, entries, owner)
        return owner, expiry, digest, inbox
      end
      lapsed[#lapsed + 1] = owner
    end
    redis.call('ZREM', queue, unpack(lapsed))
    redis.call('HDEL', entries, unpack(lapsed))
  end
end

-- Grants the free lock to `head` (taken out of the queue at `now` by `pop_live_head`, with
-- its entry's expiry, digest and inbox) for what is left of its entry (so a grant to a waiter
-- that left ends when its entry would have), with a token from `proposed` (see
-- `next_token`), and announces it on the waiter's inbox as `digest:token`. Returns the
-- grant's life in ms.
local function grant_to(lock, fence, fence_ttl, proposed, now, head, expiry, digest, inbox)
  local life = expiry - now
  local token = next_token(fence, life, fence_ttl, proposed)
  redis.call('SET', lock, head .. ':' .. string.format('%d', token), 'PX', life)
  if inbox ~= '' then
    announce(inbox, lock, digest .. ':' .. string.format('%d', token))
  end
  return life
end

-- Grants the free lock to the first live waiter (see `grant_to`). Returns the grant's life in
-- ms, or nil when nobody waits.
local function hand_over(lock, fence, queue, entries, fence_ttl, proposed)
  local now = now_ms()
  local head, expiry, digest, inbox = pop_live_head(queue, entries, now)
  if not head then
    return nil
  end
  return grant_to(lock, fence, fence_ttl, proposed, now, head, expiry, digest, inbox)
end
