-- Token bucket with nginx `limit_req burst=N nodelay` semantics, in GCRA form.
-- State: excess e (in 1/window request units: one request adds `window`, and e drains by `requests` per ms)
-- and the time t it was last written. nginx's `excess` is e / window - 1.
-- A request is allowed when max(e - requests * elapsed, 0) + window <= (burst + 1) * window, i.e. a new
-- client gets burst + 1 requests at once, then one every window / requests ms. Rejections change nothing.
-- Hits taken ahead (the last `ahead` of the hits, spent later by the caller) are held: until they may no
-- longer be spent, e drains no lower than `held * window`, as if they were still in the bucket. A full
-- bucket therefore cannot refill the room they made, and no sequence of spends admits more than the
-- bucket would have. Held hits live in time slots: those taken in slot s (now / slot) may be spent until
-- slot s + 2 begins, so the state keeps the hits held in the last two slots (h in slot s, hp in s - 1).
-- KEYS[1]  hash {e, t, h, hp, s}
-- ARGV[1]  requests per window (the refill rate)
-- ARGV[2]  window (ms)
-- ARGV[3]  burst
-- ARGV[4]  now (ms, from the caller's clock)
-- ARGV[5]  grace added to the expiry (ms)
-- ARGV[6]  hits: requests decided together (in arrival order), at least 1
-- ARGV[7]  how many of the hits (the last ones) are taken ahead
-- ARGV[8]  slot length (ms)
-- Returns {requests allowed (the first ones of the hits), excess after them (when none: the drained excess,
--          unchanged state)}. For one hit: {1|0, excess}.
local rate = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
local hits = tonumber(ARGV[6])
local ahead = tonumber(ARGV[7])
local slot_ms = tonumber(ARGV[8])
local state = redis.call('HMGET', KEYS[1], 'e', 't', 'h', 'hp', 's')
local excess = tonumber(state[1]) or 0
local last = tonumber(state[2]) or now
local h = tonumber(state[3]) or 0
local hp = tonumber(state[4]) or 0
local s = tonumber(state[5]) or 0
-- A caller whose clock is behind the last writer's drains nothing.
local now_drain = math.max(now, last)
-- Held during slot k.
local function held(k)
  if k == s then
    return h + hp
  elseif k == s + 1 then
    return h
  end
  return 0
end
-- Drain from `last` to now, slot by slot while something is held.
local t = last
local k = math.floor(t / slot_ms)
while true do
  local floor = held(k) * window
  local stop = math.min(now_drain, (k + 1) * slot_ms)
  if floor == 0 then
    stop = now_drain
  end
  excess = excess - rate * (stop - t)
  if excess < floor then
    excess = floor
  end
  if stop >= now_drain then
    break
  end
  t = stop
  k = k + 1
end
local allowed = math.min(hits, math.floor(((burst + 1) * window - excess) / window))
if allowed <= 0 then
  return {0, excess}
end
local after = excess + allowed * window
-- Slots never move back, even for a caller whose clock is behind.
local slot = math.max(math.floor(now / slot_ms), s)
if slot == s + 1 then
  h, hp = 0, h
elseif slot > s then
  h, hp = 0, 0
end
s = slot
h = h + math.max(0, allowed - (hits - ahead))
redis.call('HSET', KEYS[1], 'e', after, 't', now_drain, 'h', h, 'hp', hp, 's', s)
local ttl = math.ceil(after / rate)
if h + hp > 0 then
  ttl = math.max(ttl, (s + 2) * slot_ms - now)
end
redis.call('PEXPIRE', KEYS[1], ttl + tonumber(ARGV[5]))
return {allowed, after}
