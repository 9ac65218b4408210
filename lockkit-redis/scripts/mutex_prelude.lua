-- Shared by the mutex scripts (prepended to each, after queue.lua). A lock's value is
-- `owner-hex:token`; its waiters queue as queue.lua says, members by owner hex. (`now_ms`,
-- `token_of` and `next_token` are common.lua's; `pop_live_head` is queue.lua's.)

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
