-- Shared by a semaphore's acquire and release scripts, prepended after queue.lua and the
-- semaphore's prelude (whose `admit` it uses).

-- A fair semaphore's hand-over (queue.lua's queue, members by owner digest): gives the free
-- permits of a semaphore of `permits` to the first live waiters of `queue`, each for what is
-- left of its entry (so a grant to a waiter that left ends when its entry would have),
-- announcing each on its waiter's inbox as `name:token` (`lock`, the mutex key of the
-- semaphore's name, is what a Cluster's inbox channel carries). Stops when no permit is
-- free, when nobody waits, or at `owner` (taken out of the queue: the caller takes its
-- permit itself).
local function hand_over_permits(queue, entries, permits, owner, fence_ttl, lock, now)
  while redis.call('ZCARD', KEYS[1]) < permits do
    local head, expiry, name, inbox = pop_live_head(queue, entries, now)
    if not head or head == owner then
      return
    end
    local token = admit(head, expiry - now, fence_ttl, now)
    if inbox ~= '' then
      announce(inbox, lock, name .. ':' .. string.format('%d', token))
    end
  end
end
