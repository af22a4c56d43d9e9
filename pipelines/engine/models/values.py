"""JSON values: what storage accepts as a value, the limits readers impose, and valid job ids.

Every value storage writes (a state, a step result, a message, the data of an event) goes
through :func:`to_json_value`'s rules here; :mod:`pipelines.engine.models.stored` applies
them to whole records. The size limit is read from :mod:`pipelines.engine.models` at each
check, where it is documented as a setting (``pipelines.engine.models.MAX_VALUE_BYTES = ...``).
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any, Final

from pydantic import BaseModel
from pydantic_core import from_json as _from_json
from pydantic_core import to_json as _to_json

import pipelines.engine.models as _models  # the package holds the MAX_VALUE_BYTES setting, read at each check
from pipelines.engine.errors import InvalidJobIdError, StateNotSerializableError, ValueTooLargeError

__all__ = [
    "JOB_ID_PATTERN",
    "MAX_INT_DIGITS",
    "MAX_JSON_DEPTH",
    "MAX_VALUE_DEPTH",
    "STEP_ENVELOPE",
    "JSONValue",
    "Message",
    "check_messages",
    "check_size",
    "dump_json",
    "encode_plain",
    "fitting_start",
    "fresh_json",
    "json_data",
    "owned_json_value",
    "same_json",
    "to_json_value",
    "validate_job_id",
]

JSONValue = Any
"""A value that survives ``json.dumps``/``json.loads`` unchanged."""

Message = dict[str, Any]
"""One transcript message in the OpenAI chat format (role, content, tool_calls, ...)."""

# Job ids end up inside Redis keys ("{<id>}" hash tags) and RQ job ids, so the
# alphabet is closed: no braces, spaces, newlines or look-alike unicode.
JOB_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,200}")

_isfinite = math.isfinite  # bound once: called for every float in every value


def validate_job_id(job_id: object) -> str:
    """Return ``job_id`` if it is valid, else raise :class:`InvalidJobIdError` naming the problem."""
    if not isinstance(job_id, str):
        raise InvalidJobIdError(f"job id must be a string, got {type(job_id).__name__}")
    if not JOB_ID_PATTERN.fullmatch(job_id):
        if not job_id:
            why = "it is empty"
        elif len(job_id) > 200:
            why = f"it is {len(job_id)} characters long (at most 200)"
        else:
            bad = next(c for c in job_id if not JOB_ID_PATTERN.fullmatch(c))
            why = f"it contains {bad!r}"
        raise InvalidJobIdError(f"invalid job id {job_id[:60]!r}: {why}; allowed are 1-200 of [A-Za-z0-9._:-]")
    if job_id in (".", ".."):
        # Both name a directory, not a job, in a URL path (the web page) and a file path (blob store).
        raise InvalidJobIdError(f"invalid job id {job_id!r}: it names a directory in a path; use another id")
    return job_id


def check_size(text: str, what: str) -> str:
    """Return ``text`` if it fits in ``MAX_VALUE_BYTES``, else raise :class:`ValueTooLargeError` naming ``what``."""
    limit = _models.MAX_VALUE_BYTES
    # len() counts characters; only a text that could be too long pays for encoding.
    if len(text) * 4 > limit and len(size := text.encode()) > limit:
        raise ValueTooLargeError(
            f"{what} is {len(size) / 1048576:.1f} MiB of JSON, above the {limit / 1048576:.1f} MiB limit "
            "(pipelines.engine.models.MAX_VALUE_BYTES)"
        )
    return text


def dump_json(value: Any, what: str) -> str:
    """Compact JSON text of ``value`` for storage, checked by the rules of :func:`to_json_value`.

    Not storable raises :class:`StateNotSerializableError`, too large :class:`ValueTooLargeError`,
    both naming ``what``.
    """
    plain = to_json_value(value, what=what)
    try:
        text = encode_plain(plain)
    except ValueError as exc:  # sys.set_int_max_str_digits() lowered after import
        raise StateNotSerializableError(f"{what} is not JSON-serialisable: {exc}") from exc
    return check_size(text, what)


def encode_plain(plain: Any) -> str:
    """Compact JSON text of ``plain``, data :func:`to_json_value` returned (checked already), for storage."""
    limit = sys.get_int_max_str_digits()
    if 0 < limit < MAX_INT_DIGITS:
        # Lowered after import: json.dumps applies the new limit (ValueError), so no reader fails later.
        return json.dumps(plain, allow_nan=False, separators=(",", ":"))
    # pydantic-core's encoder: several times json.dumps on plain data, the same compact text
    # except that non-ASCII stays UTF-8 instead of \u escapes (it reads back the same).
    return _to_json(plain).decode()


STEP_ENVELOPE: Final = 4096  # bytes kept free around a value stored in a journal step (an inbox taken as a list)


def fitting_start(values: list[Any]) -> list[Any]:
    """The longest start of ``values`` (plain JSON) whose list fits in one stored value; at least the first.

    For what one write takes from a queue of values each checked on its own (a job's inbox, journaled whole):
    each must be under ``MAX_VALUE_BYTES - STEP_ENVELOPE`` (``app.send`` refuses a larger message).
    """
    room, used = _models.MAX_VALUE_BYTES - STEP_ENVELOPE, 0
    for i, value in enumerate(values):
        used += len(encode_plain(value).encode()) + 1
        if used > room and i:
            return values[:i]
    return values


def check_messages(messages: Sequence[Any], what: str) -> list[Message]:
    """``messages`` in JSON form, each a dict with a ``role``; else :class:`StateNotSerializableError`."""
    # Each message is a value of its own (as storage keeps it), not a level inside a list.
    checked: list[Message] = [to_json_value(m, what=what) for m in list(messages)]
    for m in checked:
        if not isinstance(m, dict) or "role" not in m:
            raise StateNotSerializableError(f"a transcript message must be a dict with a 'role', got {m!r:.80}")
    return checked


MAX_JSON_DEPTH: Final = 200
"""How deeply lists/dicts may nest in one stored JSON document: the recursion limit of
pydantic-core's JSON parser, which reads records, logs and events back (one level deeper is
"recursion limit exceeded" on every later read). A reader's limit, so not tunable."""

# The deepest a value sits inside a stored document: record -> checkpoint -> journal -> step result.
_ENVELOPE_DEPTH: Final = 3

MAX_VALUE_DEPTH: Final = MAX_JSON_DEPTH - _ENVELOPE_DEPTH
"""How deeply lists/dicts may nest in one value (a state, result, message, step result, the data
of an event): 197, so the value reads back wherever storage puts it. Deeper is refused."""

MAX_INT_DIGITS: Final = min(4300, sys.get_int_max_str_digits() or 4300)
"""The most decimal digits an int in a value may have: pydantic-core's parser refuses longer ones
("number out of range") and ``json.loads`` applies ``sys.get_int_max_str_digits()`` (4300 unless
lowered). Longer ints are refused; store them as strings."""

_INT_BOUND: Final = 10**MAX_INT_DIGITS  # abs(n) < _INT_BOUND  <=>  n has at most MAX_INT_DIGITS digits
_ROUND_TRIP: Final = ("does not survive a JSON round trip (tuples, non-string keys or the like); "
                      "use lists and str keys")


class _RefusedError(Exception):
    """Why a value cannot be stored; the public entry points prefix it with what the value is."""


def _bad_str(text: str, where: str) -> None:
    """Refuse ``text`` if it holds a surrogate code point: UTF-8 cannot carry one, so no reader gets it back."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise _RefusedError(f"contains a lone surrogate {text[exc.start]!r} in {where} (not valid UTF-8; "
                       "decode text with errors='replace')") from None


def _big_int(n: int) -> _RefusedError:
    digits = int(n.bit_length() * 0.30103) + 1  # str(n) itself would fail past the limit
    return _RefusedError(f"has an int of about {digits} digits, more than the {MAX_INT_DIGITS} JSON readers accept "
                    "(pipelines.engine.models.MAX_INT_DIGITS); store it as a string")


def _too_deep() -> _RefusedError:
    return _RefusedError(f"nests lists/dicts deeper than {MAX_VALUE_DEPTH} levels "
                         "(pipelines.engine.models.MAX_VALUE_DEPTH), more than storage can read back")


def _not_json(why: str) -> _RefusedError:
    return _RefusedError(f"is not JSON-serialisable: {why}")


def _plain(value: Any, room: int = MAX_VALUE_DEPTH) -> bool:
    """True for data made only of dict/list/str/int/finite float/bool/None (exact types, str keys).

    The hot path: it runs on every journaled step, message and event, and
    walks the value once. On the way it enforces the readers' limits (nesting
    within ``room`` levels, int digits, no surrogates, finite floats), raising
    :class:`_RefusedError`; False means "not plain": :func:`_convert` decides.
    """
    t = type(value)
    if t is dict:
        return _plain_dict(value, room)
    if t is list:
        return _plain_list(value, room)
    if t is str:
        if not value.isascii():
            _bad_str(value, "a string")
        return True
    if t is int:
        if not -_INT_BOUND < value < _INT_BOUND:
            raise _big_int(value)
        return True
    if t is float:
        if not _isfinite(value):
            raise _not_json(f"{value!r} is not a JSON number")
        return True
    return t is bool or value is None


def _plain_dict(value: dict[Any, Any], room: int) -> bool:
    # Leaf types are tested inline: a call per leaf costs more than the check.
    if room <= 0:
        raise _too_deep()
    for k, v in value.items():
        if type(k) is not str:
            return False
        if not k.isascii():
            _bad_str(k, "a dict key")
        tv = type(v)
        if tv is str:
            if not v.isascii():
                _bad_str(v, "a string")
        elif tv is int:
            if not -_INT_BOUND < v < _INT_BOUND:
                raise _big_int(v)
        elif not (tv is bool or v is None) and not _plain(v, room - 1):
            return False
    return True


def _plain_list(value: list[Any], room: int) -> bool:
    if room <= 0:
        raise _too_deep()
    for v in value:
        tv = type(v)
        if tv is str:
            if not v.isascii():
                _bad_str(v, "a string")
        elif tv is int:
            if not -_INT_BOUND < v < _INT_BOUND:
                raise _big_int(v)
        elif not (tv is bool or v is None) and not _plain(v, room - 1):
            return False
    return True


def _convert(value: Any, room: int) -> JSONValue:
    """The plain JSON data ``value`` stands for, built anew: the slow path for what :func:`_plain` left.

    Enums of str/int become their value, subclasses of str/int/float their
    base type; tuples and non-str keys are refused, since JSON would hand back
    something else (a list, a str key) and a replay would behave differently.
    """
    if isinstance(value, Enum):
        return _convert(_enum_value(value), room)
    if isinstance(value, dict):
        if room <= 0:
            raise _too_deep()
        return {_convert_key(k): _convert(v, room - 1) for k, v in value.items()}
    if isinstance(value, list):
        if room <= 0:
            raise _too_deep()
        return [_convert(v, room - 1) for v in value]
    if isinstance(value, tuple):
        raise _RefusedError(_ROUND_TRIP)
    value = _base_scalar(value)
    if _plain(value, room):
        return value
    raise _not_json(f"Object of type {type(value).__name__} is not JSON serializable")


def _base_scalar(value: Any) -> Any:
    """A subclass of str/int/float as its base type (what JSON hands back); anything else as it is."""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int) and type(value) is not bool:
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    return value


def _convert_key(key: Any) -> str:
    if isinstance(key, Enum):
        key = _enum_value(key)
    if isinstance(key, str):
        text = str.__str__(key)
        if not text.isascii():
            _bad_str(text, "a dict key")
        return text
    if key is None or isinstance(key, int | float):
        raise _RefusedError(_ROUND_TRIP)  # JSON would turn the key into a string
    raise _not_json(f"a dict key of type {type(key).__name__}; keys must be str")


_ENUM_VALUE_TYPES: Final = (str, int)


def _enum_value(member: Enum) -> Any:
    value = member.value
    if type(value) in _ENUM_VALUE_TYPES:
        return value
    raise _not_json(f"{member!r} is an enum of {type(value).__name__}; only enums of str or int are stored "
                    "(as their value)")


def to_json_value(value: Any, *, what: str = "value") -> JSONValue:
    """Convert ``value`` (a pydantic model or plain JSON data) into plain JSON data.

    The result is what storage will hand back later, so callers see the same
    thing on a fresh run and on a replay. The rules, the same for every value
    storage writes:

    - dict (str keys), list, str, int, finite float, bool and None are kept;
      a pydantic model becomes ``model_dump(mode="json")``;
    - an enum member whose value is a str or int (``StrEnum``, ``IntEnum``, or
      a plain ``Enum`` of such values) becomes its value, as a key too; other
      enums are refused; subclasses of str/int/float become the base type;
    - refused with :class:`StateNotSerializableError` naming ``what`` and why:
      sets, tuples, bytes, other objects, NaN/inf, non-str keys, lists/dicts
      nested deeper than :data:`MAX_VALUE_DEPTH`, ints of more than
      :data:`MAX_INT_DIGITS` digits, and strings holding a lone surrogate
      (``"\\ud83d"``), which UTF-8 cannot carry. Storage could not read those
      back, or would read back something else.
    """
    try:
        if isinstance(value, BaseModel):
            value = _model_data(value)
        if _plain(value, MAX_VALUE_DEPTH):
            return value  # already exactly its JSON form: no copy (hot path)
        return _convert(value, MAX_VALUE_DEPTH)
    except _RefusedError as exc:
        raise StateNotSerializableError(f"{what} {exc}") from None


def owned_json_value(value: Any, *, what: str = "value") -> JSONValue:
    """:func:`to_json_value` of ``value``, sharing no list or dict with it: what the engine keeps of a user's value.

    A record the engine commits may stay in memory as it is (a storage's warm load, the memory
    adapter's record), so the state and result it holds must be the engine's own: a caller that
    changes the dict it returned, after returning it, must not change a stored record.
    """
    plain = to_json_value(value, what=what)
    return fresh_json(plain) if plain is value else plain


def fresh_json(plain: JSONValue) -> JSONValue:
    """A new copy of ``plain`` (data :func:`to_json_value` returned): the same value, no list or dict shared.

    What a phase is given of its stored state, so that changing it in place changes no record a
    storage holds. Copied as storage would give it back (pydantic-core's encoder and parser).
    """
    t = type(plain)
    if t is not dict and t is not list:
        return plain  # a str, number, bool or None: nothing shared to change
    return _from_json(_to_json(plain)) if plain else t()


def same_json(value: Any, plain: JSONValue) -> bool:
    """Whether ``value`` is exactly ``plain`` (plain JSON data) as storage would write it: ``1`` is not ``1.0``.

    False for anything JSON could not carry as it is (refused or converted later, where it is stored).
    """
    try:
        return bool(_plain(value, MAX_VALUE_DEPTH)) and _to_json(value) == _to_json(plain)
    except (_RefusedError, ValueError):
        return False


def json_data(data: dict[str, Any], what: Callable[[], str]) -> dict[str, Any]:
    """``data`` (a dict made for the call, like keyword arguments) in JSON form, by :func:`to_json_value`'s rules.

    ``data`` itself when it is plain already, which is what the hot path sees: then
    ``what()``, the description an error would carry, is never built.
    """
    try:
        if _plain_dict(data, MAX_VALUE_DEPTH):
            return data
    except _RefusedError:
        pass  # to_json_value says why, naming what()
    plain: dict[str, Any] = to_json_value(data, what=what())
    return plain


def _model_data(model: BaseModel) -> Any:
    try:
        return model.model_dump(mode="json")
    except (ValueError, RecursionError) as exc:  # PydanticSerializationError is a ValueError
        raise _not_json(str(exc)) from None
