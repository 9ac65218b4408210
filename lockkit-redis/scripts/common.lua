-- Shared by every script (prepended to each): the server's clock, a lock value's owner, keeping
-- a key alive, and the one way fencing tokens are minted.

-- The server's clock in ms: one clock decides every expiry.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The token `held` (a lock value, `owner-hex:token`) carries if `owner` holds it, else nil.
local function token_of(held, owner)
  if string.sub(held, 1, #owner + 1) == owner .. ':' then
    return tonumber(string.sub(held, #owner + 2))
  end
  return nil
end

-- Keeps `key` alive at least `ms` more ms, never shortening it.
local function keep_alive(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, string.format('%d', ms))
  end
end

-- The next fencing token of the counter `fence`, for every kind of grant: the larger of the
-- counter plus one and a clock in microseconds (`proposed`, or the server's when it is ''), so
-- tokens keep increasing after the counter expires or the data is lost, unless that clock steps
-- back. The counter lives at least as long as the grant (`ttl` ms), at least `fence_ttl` ms,
-- and never shorter than it did (a semaphore's other holders count on it).
local function next_token(fence, ttl, fence_ttl, proposed)
  local token = tonumber(proposed)
  if not token then
    local now = redis.call('TIME')
    token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  end
  local life = string.format('%d', math.max(tonumber(ttl), tonumber(fence_ttl), redis.call('PTTL', fence)))
  -- The clock is nearly always ahead of the counter: written with the counter's old value
  -- read in the same call, and written again in the rare case it was not ahead.
  local counter = tonumber(redis.call('SET', fence, string.format('%d', token), 'PX', life, 'GET'))
  if counter and counter >= token then
    token = counter + 1
    redis.call('SET', fence, string.format('%d', token), 'PX', life)
  end
  return token
end

