-- Fixed window: one counter per window aligned to the epoch, so every sidecar agrees on window edges.
-- KEYS[1]  counter of the window that holds "now" (the window index is part of the key)
-- ARGV[1]  requests allowed per window
-- ARGV[2]  expiry in ms, set on the first hit only (the key outlives its window by a grace period)
-- ARGV[3]  hits: requests decided together (in arrival order), at least 1
-- Returns {requests allowed (the first ones of the hits), count after them}. For one hit: {1|0, count}.
-- Rejected requests are not counted: raising the limit mid-window lets traffic through at once.
local limit = tonumber(ARGV[1])
local hits = tonumber(ARGV[3])
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
local allowed = math.min(hits, limit - count)
if allowed <= 0 then
  return {0, count}
end
count = redis.call('INCRBY', KEYS[1], allowed)
if count == allowed then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return {allowed, count}
