-- Reads the holder's value and remaining TTL atomically.
-- KEYS[1] lock key. Returns {value or false, remaining TTL in ms}.
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
