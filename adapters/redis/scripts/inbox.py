"""The inbox: SEND (append messages, only while the job's status takes them)."""

from __future__ import annotations

from adapters.base import INBOX_OPEN
from adapters.redis.scripts.functions import TOKENS_FN, TYPES_FN

__all__ = ["SEND"]

# KEYS: record, inbox; ARGV: token, then the messages (JSON lines)
# Reply: the inbox's new length, -1 for an unknown job, 'closed:<status>' (nothing
# appended) for a job whose status takes no messages. Outside the version
# fence (a turn in flight still commits); the count lives in the record hash.
SEND = TYPES_FN + TOKENS_FN + """
local OPEN = {""" + ", ".join(f"['{s.value}'] = true" for s in INBOX_OPEN) + """}
local bad = wrong_type({KEYS[1], 'record', 'hash', KEYS[2], 'inbox', 'list'})
if bad then return bad end
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
-- A re-sent call (its reply was lost) must not add the messages twice.
if seen('send_tokens', ARGV[1]) then
  return tonumber(redis.call('HGET', KEYS[1], 'inbox') or '0')
end
-- The status is read in the step that appends: a run cannot end between the check and the
-- append, so no message lands in an inbox that no turn will read. A record written before
-- 'st' existed has its status only inside its JSON (absent there: the default, idle); every
-- version that writes record format 2 ('base' and 'dx': adapters.redis.record_format) writes 'st'.
local st = redis.call('HGET', KEYS[1], 'st')
if not st then
  local ok, rec = pcall(cjson.decode, redis.call('HGET', KEYS[1], 'data') or '')
  st = ok and type(rec) == 'table' and type(rec.status) == 'string' and rec.status or 'idle'
end
if not OPEN[st] then return 'closed:' .. st end
for i = 2, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
remember('send_tokens', ARGV[1])
return redis.call('HINCRBY', KEYS[1], 'inbox', #ARGV - 1)
"""
