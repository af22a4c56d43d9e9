"""How a litellm failure reaches the agent turn: our error classes, the Retry-After hint, no secret in any message.

:func:`_translate` maps a litellm / OpenAI SDK exception to
:class:`~pipelines.engine.errors.PermanentModelError` or a retryable
:class:`~pipelines.engine.errors.TransientModelError`, its message redacted:
every value of a secret parameter (:func:`phases.model.is_secret_param`) and
every credential-shaped string becomes ``***``. The parameter names that
count as secret also decide what :meth:`LiteLLMModel.safe_params` shows.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from phases.model import is_secret_param, looks_secret, shown_address
from pipelines.engine.errors import ModelError, PermanentModelError, TransientModelError, bound_retry_after
from pipelines.engine.masking import CREDENTIAL_NAME, mask

__all__: list[str] = []  # private helpers of phases.litellm_model, which re-exports what tests and benches use

# Shorter values are not masked: replacing every "ab" in a message helps nobody.
_MIN_SECRET_LEN = 4


class _RetryableError(TransientModelError):
    """A transient failure of one attempt: retried within the budget, then re-raised as TransientModelError."""


# --- error translation ---------------------------------------------------------


def _translate(exc: Exception, model: str, params: Mapping[str, Any]) -> ModelError:
    """Map a litellm/OpenAI SDK exception to ours, with secrets masked in the message."""
    from phases.litellm_model import _litellm  # the one configured import of litellm

    lm = _litellm()
    status = getattr(exc, "status_code", None)
    text = str(exc)
    # litellm's messages already start with their class ("litellm.RateLimitError: ...").
    detail = _redact(text if text.startswith("litellm.") else f"{type(exc).__name__}: {text}", params)
    permanent: list[tuple[Any, int | None, str]] = [
        (lm.ContextWindowExceededError, None, f"context window exceeded for model {model}"),
        (lm.AuthenticationError, 401, f"authentication failed for model {model} (check api_key)"),
        (lm.PermissionDeniedError, 403, f"permission denied for model {model}"),
        (lm.NotFoundError, 404, f"model {model} or its endpoint was not found"),
        (lm.BadRequestError, 400, f"bad request to model {model}"),
        (lm.UnprocessableEntityError, 422, f"bad request to model {model}"),
    ]
    for cls, code, what in permanent:
        if isinstance(exc, cls) or (code is not None and status == code):
            return PermanentModelError(f"{what}: {detail}")
    if any(sign in text.lower() for sign in _NO_KEY):
        # The OpenAI SDK finds no key before sending anything; litellm files that under InternalServerError, which
        # would be retried (the turn again and again, the job looking stuck) for what only a person can fix.
        return PermanentModelError(f"no API key for model {model}: set the provider's key in the environment "
                                   f"(OPENAI_API_KEY, ...) or pass api_key: {detail}")
    if _UNREADABLE in text:
        return _unreadable(model, detail)
    transient = (lm.RateLimitError, lm.Timeout, lm.InternalServerError, lm.BadGatewayError,
                 lm.ServiceUnavailableError, lm.APIConnectionError)
    if isinstance(exc, transient) or (isinstance(status, int) and (status in (408, 409, 429, 529) or status >= 500)):
        return _RetryableError(f"model {model} is unavailable for now: {detail}", retry_after=_retry_after(exc))
    return PermanentModelError(f"model call to {model} failed: {detail}")


_UNREADABLE = "Invalid response object"
"""How litellm says a provider's answer (an HTTP 200) is of a shape it cannot read; it files that under
InternalServerError (status 500), which was retried as a transient failure."""

_VALIDATION = re.compile(r"validation errors? for \w+\n(.+)\n\s+(.+?)(?: \[|$)", re.MULTILINE)


def _unreadable(model: str, detail: str) -> PermanentModelError:
    """A provider's answer litellm cannot read, as a permanent error that counts one paid call.

    Permanent: the provider answered, and the same request gets an answer of the same shape (content as a list
    of parts, a token count that is no whole number...), so retrying paid for answer after answer (5 turns of
    a minute's retries: over a hundred calls) for the same failure. The call was answered, so it is paid for:
    counted (tokens unknown) for the job's budgets.
    """
    from pipelines.engine.models import Usage

    head = detail.split(" Traceback", 1)[0]  # litellm appends its whole traceback and the response object
    why = _VALIDATION.search(detail)
    reason = f" ({why.group(1).strip()}: {why.group(2).strip()[:300]})" if why else ""
    error = PermanentModelError(f"model {model} answered with a response litellm cannot read, not retried: "
                                f"{head}{reason}")
    error.usage = Usage(model_calls=1, unknown_cost_calls=1)
    return error


_NO_KEY = ("missing credentials", "api_key client option must be set")
"""How a provider SDK says it has no key (lower case): no request was sent, and none will succeed."""


def _retry_after(exc: Exception) -> float | None:
    """The server's Retry-After hint in seconds (``retry-after-ms``, seconds or an HTTP date), if any.

    Bounded before use (:func:`~pipelines.engine.errors.bound_retry_after`): ``inf``, ``1e9`` or a date
    years ahead is the documented maximum, ``nan`` no hint; else the retry waits, and a rate-limited
    model stays blocked for every job, for ever.
    """
    headers = getattr(exc, "litellm_response_headers", None) or getattr(getattr(exc, "response", None), "headers", None)
    if not headers:
        return None
    lower = {str(k).lower(): str(v) for k, v in dict(headers).items()}
    if "retry-after-ms" in lower:
        with contextlib.suppress(ValueError, TypeError, OverflowError):
            return bound_retry_after(float(lower["retry-after-ms"]) / 1000)
        # One that does not parse says nothing: the plain Retry-After beside it may.
    value = lower.get("retry-after")
    if value is None:
        return None
    try:
        try:
            return bound_retry_after(float(value))
        except ValueError:
            return bound_retry_after(parsedate_to_datetime(value).timestamp() - time.time())
    except (ValueError, TypeError, OverflowError):
        return None


def _without_secrets(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_secrets(v) for k, v in value.items() if not is_secret_param(str(k))}
    if isinstance(value, list | tuple):
        return [_without_secrets(v) for v in value]
    if isinstance(value, str):  # a credential's shape, or a gateway token in an address's query string or user part
        return "[hidden]" if looks_secret(value) else shown_address(value)
    return value


def _collect_strings(value: Any, into: set[str]) -> None:
    if isinstance(value, str):
        into.add(value)
        # "Bearer sk-..." may show up in an error as the bare token.
        into.update(part for part in value.split() if len(part) >= 8)
    elif isinstance(value, Mapping):
        for item in value.values():
            _collect_strings(item, into)
    elif isinstance(value, list | tuple | set):
        for item in value:
            _collect_strings(item, into)


def _secret_values(params: Mapping[str, Any]) -> set[str]:
    found: set[str] = set()
    for name, value in params.items():
        if is_secret_param(str(name)):
            _collect_strings(value, found)
        elif isinstance(value, Mapping):
            found |= _secret_values(value)
        elif isinstance(value, str) and "://" in value:
            found |= _address_secrets(value)
    return {s for s in found if len(s) >= _MIN_SECRET_LEN}  # the environment's are masking's own (higher bar)


def _address_secrets(address: str) -> set[str]:
    """An address's password and the values of its query parameters named as credentials (``CREDENTIAL_NAME``):
    a provider may echo them anywhere in its text (``?api-version=2024-10-21`` is no secret to mask)."""
    try:
        parts = urlsplit(address)
        values = {v for name, v in parse_qsl(parts.query, keep_blank_values=False) if CREDENTIAL_NAME.match(name)}
        if parts.password:
            values.add(parts.password)
    except ValueError:
        return set()
    return values


def _redact(text: str, params: Mapping[str, Any]) -> str:
    """``text`` with every secret value of ``params`` (and credential-shaped strings) replaced by ``***``."""
    return mask(text, _secret_values(params))


def _is_loopback_url(url: str) -> bool:
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return False
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
