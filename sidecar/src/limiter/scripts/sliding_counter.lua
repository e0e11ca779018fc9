-- Sliding-window counter (Cloudflare's estimate): the previous window's count weighted by how much of it
-- still overlaps the sliding window, plus the current window's count. Integer arithmetic scaled by the
-- window length, so the in-process copy of this math gets exactly the same answers.
-- KEYS[1]  counter of the current aligned window
-- KEYS[2]  counter of the previous aligned window
-- ARGV[1]  requests allowed per window
-- ARGV[2]  window (ms)
-- ARGV[3]  ms elapsed since the current window began
-- ARGV[4]  expiry of the current counter in ms (set on the first hit only)
-- ARGV[5]  hits: requests decided together (in arrival order), at least 1
-- Returns {requests allowed (the first ones of the hits), previous count, current count after them}.
-- A request is allowed when prev * (window - elapsed) + (cur + 1) * window <= limit * window.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local elapsed = tonumber(ARGV[3])
local hits = tonumber(ARGV[5])
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local prev = tonumber(redis.call('GET', KEYS[2]) or '0')
local room = limit * window - prev * (window - elapsed) - cur * window
local allowed = 0
if room >= window then
  allowed = math.min(hits, math.floor(room / window))
end
if allowed == 0 then
  return {0, prev, cur}
end
cur = redis.call('INCRBY', KEYS[1], allowed)
if cur == allowed then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
return {allowed, prev, cur}
