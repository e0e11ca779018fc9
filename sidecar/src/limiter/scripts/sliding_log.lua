-- Sliding-window log: a sorted set of the admission times (ms) of the requests in the last window.
-- A request at time t counts for requests in (t - window, t].
-- KEYS[1]  the sorted set
-- ARGV[1]  now (ms, from the caller's clock)
-- ARGV[2]  window (ms)
-- ARGV[3]  requests allowed per window
-- ARGV[4]  member prefix: unique across sidecars and calls (time, instance id, sequence number); each
--          admitted request adds the member prefix:i
-- ARGV[5]  expiry in ms
-- ARGV[6]  hits: requests decided together (in arrival order), at least 1
-- Returns {requests allowed (the first ones of the hits), count after them, time of the entry whose expiry
--          frees a slot (0 when all were allowed), newest entry}.
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local hits = tonumber(ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
local allowed = math.max(math.min(hits, limit - count), 0)
if allowed > 0 then
  local add = {}
  for i = 0, allowed - 1 do
    add[#add + 1] = now
    add[#add + 1] = ARGV[4] .. ':' .. i
  end
  redis.call('ZADD', KEYS[1], unpack(add))
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  count = count + allowed
end
local freeing = 0
if allowed < hits then
  freeing = tonumber(redis.call('ZRANGE', KEYS[1], count - limit, count - limit, 'WITHSCORES')[2])
end
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
return {allowed, count, freeing, tonumber(newest[2])}
