-- Sliding-window counter (Cloudflare's estimate): the previous window's count weighted by how much of it
-- still overlaps the sliding window, plus the current window's count. Integer arithmetic scaled by the
-- window length, so the in-process copy of this math gets exactly the same answers.
-- KEYS[1]  counter of the current aligned window
-- KEYS[2]  counter of the previous aligned window
-- ARGV[1]  requests allowed per window
-- ARGV[2]  window (ms)
-- ARGV[3]  ms elapsed since the current window began
-- ARGV[4]  expiry of the current counter in ms (set on the first hit only)
-- Returns {allowed, previous count, current count after this request}.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local elapsed = tonumber(ARGV[3])
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local prev = tonumber(redis.call('GET', KEYS[2]) or '0')
if prev * (window - elapsed) + (cur + 1) * window > limit * window then
  return {0, prev, cur}
end
cur = redis.call('INCR', KEYS[1])
if cur == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
return {1, prev, cur}
