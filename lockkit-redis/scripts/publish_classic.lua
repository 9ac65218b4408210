-- Prepended to every script that publishes (see `publish_sharded.lua` for a Redis Cluster's
-- primaries): `publish` sends a release notification on a lock's channel, `announce` a
-- hand-over on its waiter's inbox (the same channel for every lock of that waiter's client).
-- A denied announcement (an ACL without the inbox channels) must not fail the release: the
-- waiter then finds the lock its own at its next attempt.
local function publish(channel, message)
  redis.call('PUBLISH', channel, message)
end

local function announce(inbox, lock, message)
  redis.pcall('PUBLISH', inbox, message)
end

