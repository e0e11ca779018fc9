-- Fixed window: one counter per window aligned to the epoch, so every sidecar agrees on window edges.
-- KEYS[1]  counter of the window that holds "now" (the window index is part of the key)
-- ARGV[1]  requests allowed per window
-- ARGV[2]  expiry in ms, set on the first hit only (the key outlives its window by a grace period)
-- Returns {allowed (1|0), count after this request}.
-- Rejected requests are not counted: raising the limit mid-window lets traffic through at once.
local limit = tonumber(ARGV[1])
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
if count >= limit then
  return {0, count}
end
count = redis.call('INCR', KEYS[1])
if count == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return {1, count}
