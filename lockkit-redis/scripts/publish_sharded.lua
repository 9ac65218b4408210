-- Prepended to every script that publishes on a Redis Cluster's primary (Redis 7 or later):
-- shard channels, heard only on the nodes that serve the channel's slot, instead of a message
-- the cluster bus broadcasts to every node. Every channel carries its lock's hash tag, as a
-- script may only publish in its keys' slot: a waiter's inbox is one channel per lock,
-- `inbox:lock` (the lock key's tag comes first, as the inbox name has no braces). A denied
-- announcement must not fail the release (see `publish_classic.lua`).
local function publish(channel, message)
  redis.call('SPUBLISH', channel, message)
end

local function announce(inbox, lock, message)
  redis.pcall('SPUBLISH', inbox .. ':' .. lock, message)
end

