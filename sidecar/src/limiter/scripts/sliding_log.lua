-- Sliding-window log: a sorted set of the admission times (ms) of the requests in the last window.
-- A request at time t counts for requests in (t - window, t].
-- KEYS[1]  the sorted set
-- ARGV[1]  now (ms, from the caller's clock)
-- ARGV[2]  window (ms)
-- ARGV[3]  requests allowed per window
-- ARGV[4]  member: unique across sidecars (time, instance id, sequence number)
-- ARGV[5]  expiry in ms
-- Returns {allowed, count after this request, time of the entry whose expiry frees a slot (0 when allowed),
--          newest entry}.
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
if count < limit then
  redis.call('ZADD', KEYS[1], now, ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  return {1, count + 1, 0, tonumber(newest[2])}
end
local freeing = redis.call('ZRANGE', KEYS[1], count - limit, count - limit, 'WITHSCORES')
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
return {0, count, tonumber(freeing[2]), tonumber(newest[2])}
