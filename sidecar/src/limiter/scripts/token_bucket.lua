-- Token bucket with nginx `limit_req burst=N nodelay` semantics, in GCRA form.
-- State: excess e (in 1/window request units: one request adds `window`, and e drains by `requests` per ms)
-- and the time t it was last written. nginx's `excess` is e / window - 1.
-- A request is allowed when max(e - requests * elapsed, 0) + window <= (burst + 1) * window, i.e. a new
-- client gets burst + 1 requests at once, then one every window / requests ms. Rejections change nothing.
-- KEYS[1]  hash {e, t}
-- ARGV[1]  requests per window (the refill rate)
-- ARGV[2]  window (ms)
-- ARGV[3]  burst
-- ARGV[4]  now (ms, from the caller's clock)
-- ARGV[5]  grace added to the expiry (ms)
-- ARGV[6]  hits: requests decided together (in arrival order), at least 1
-- Returns {requests allowed (the first ones of the hits), excess after them (when none: the drained excess,
--          unchanged state)}. For one hit: {1|0, excess}.
local rate = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
local hits = tonumber(ARGV[6])
local state = redis.call('HMGET', KEYS[1], 'e', 't')
local excess = tonumber(state[1]) or 0
local last = tonumber(state[2]) or now
local elapsed = now - last
if elapsed < 0 then
  elapsed = 0
end
excess = excess - rate * elapsed
if excess < 0 then
  excess = 0
end
local allowed = math.min(hits, math.floor(((burst + 1) * window - excess) / window))
if allowed <= 0 then
  return {0, excess}
end
local after = excess + allowed * window
if now > last then
  last = now
end
redis.call('HSET', KEYS[1], 'e', after, 't', last)
redis.call('PEXPIRE', KEYS[1], math.ceil(after / rate) + tonumber(ARGV[5]))
return {allowed, after}
