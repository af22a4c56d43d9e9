"""The record hash's writes outside the version fence.

CONTROL (a pause or cancel request) and DROPPED (a fenced-off attempt's usage,
and what its model answered: the ``fenced`` field, one JSON line per attempt).
"""

from __future__ import annotations

from adapters.redis.scripts.functions import TOKENS_FN, TYPES_FN

__all__ = ["CONTROL", "DROPPED", "POSTPONE"]

# KEYS: record; ARGV: request ('' = clear)
# Reply: 1 stored, 0 unknown job. Only the 'control' field is written: the
# record's data and version stay as they are, so a turn in flight still commits.
CONTROL = TYPES_FN + """
local bad = wrong_type({KEYS[1], 'record', 'hash'})
if bad then return bad end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[1] == 'pause' and redis.call('HGET', KEYS[1], 'control') == 'cancel' then return 1 end  -- the cancel stays
if ARGV[1] == '' then redis.call('HDEL', KEYS[1], 'control') else redis.call('HSET', KEYS[1], 'control', ARGV[1]) end
return 1
"""

# KEYS: record, the due index of its bucket; ARGV: version, due_at, job_id. Reply: 1 moved, 0 not (the job
# moved on, is not due, or is due later already). A deferred turn's later place in the due index.
POSTPONE = TYPES_FN + """
local bad = wrong_type({KEYS[1], 'record', 'hash', KEYS[2], 'due', 'zset'})
if bad then return bad end
if redis.call('HGET', KEYS[1], 'version') ~= ARGV[1] then return 0 end
local due = redis.call('ZSCORE', KEYS[2], ARGV[3])
if not due or tonumber(due) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[2], 'XX', ARGV[2], ARGV[3])
return 1
"""

# KEYS: record; ARGV: token, the usage to add (JSON: {"prompt_tokens", ...}; '{}': none), and optionally
# the attempt's answer (one JSON line, no newline in it) with how many such lines the job keeps.
# Reply: 1 counted (or already, for a re-sent call), 0 unknown job. The usage of
# attempts that were fenced off after paying for a model call: outside the
# version fence (the attempt can no longer commit), summed as one JSON field.
# The answer is appended to 'fenced' as text, never decoded here (cjson would
# turn an empty list into an object).
DROPPED = TYPES_FN + TOKENS_FN + """
local bad = wrong_type({KEYS[1], 'record', 'hash'})
if bad then return bad end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if seen('dropped_tokens', ARGV[1]) then return 1 end
if ARGV[2] ~= '{}' then
  local add = cjson.decode(ARGV[2])
  local raw = redis.call('HGET', KEYS[1], 'dropped')
  local sum = raw and cjson.decode(raw) or {}
  for k, v in pairs(add) do sum[k] = (sum[k] or 0) + v end
  redis.call('HSET', KEYS[1], 'dropped', cjson.encode(sum))
end
if ARGV[3] then
  local lines = {}
  for line in string.gmatch(redis.call('HGET', KEYS[1], 'fenced') or '', '[^\\n]+') do lines[#lines + 1] = line end
  lines[#lines + 1] = ARGV[3]
  while #lines > tonumber(ARGV[4]) do table.remove(lines, 1) end
  redis.call('HSET', KEYS[1], 'fenced', table.concat(lines, '\\n'))
end
remember('dropped_tokens', ARGV[1])
return 1
"""
