"""Credentials masked (``***``) in text that leaves the process: a model's error, an error's message in a trace.

One set of rules for every place that masks: a litellm model's errors (:mod:`phases.litellm_errors`, which
adds the values of the call's own secret parameters) and the exception events of traces
(:func:`pipelines.engine.telemetry.redacted`, for any model's or tool's error).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

__all__ = ["CREDENTIAL_NAME", "mask"]

# Environment variables whose values a provider's client may read as credentials.
_SECRET_ENV = re.compile(r"API_KEY|_TOKEN|SECRET|PASSWORD|CREDENTIALS", re.IGNORECASE)
_CREDENTIAL_WORDS = ("(?:api[_-]?key|key|access[_-]?token|token|sig|signature|secret|code|auth|password|passwd"
                     "|credential)")
"""A query parameter holds a credential when one of these is a whole part of its name (split at ``_ . -``)."""
_CREDENTIAL_PARAM = rf"(?:[\w.-]*[_.-])?{_CREDENTIAL_WORDS}(?:[_.-][\w.-]*)?"
CREDENTIAL_NAME = re.compile(rf"(?i)^{_CREDENTIAL_PARAM}$")
"""A query parameter's name that says its value is a credential (``key``, ``access_token``, ``X-Amz-Signature``)."""

# Shapes of credentials masked even when they came from elsewhere.
_SECRET_SHAPES = (
    # The token up to a space, quote, comma, semicolon or closing bracket: the text around it stays readable
    # ("(Bearer ***); retrying"). Nothing a token holds (RFC 6750: A-Z a-z 0-9 - . _ ~ + / =) ends it.
    (re.compile(r"(?i)(bearer\s+)[^\s'\",;)\]}>]+"), r"\1***"),
    # Authorization: Basic <base64 of user:password>; a digit or + / = in it, so "Basic authentication" stays
    (re.compile(r"(?i)(basic\s+)(?=[A-Za-z]*[0-9+/=])[A-Za-z0-9+/=]{8,}"), r"\1***"),
    # A key named as such in a header or a JSON/dict text: x-api-key: ..., "api_key": "...", api-key=...
    (re.compile(r"(?i)((?:x-)?api[_-]?key['\"]?\s*[:=]\s*['\"]?)[^\s'\",;)\]}>]+"), r"\1***"),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "AKIA***"),  # an AWS access key id
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}"), "sk-***"),
    (re.compile(r"(://)[^/\s:@]*:[^/\s@]+@"), r"\1***@"),  # user:password@ (or :password@) in a URL
    # ?key=, ?access_token=, ?X-Amz-Signature=, ?code=... in an address (Gemini, gateways, signed URLs): a
    # credential word as a whole part of the name (not ?max_tokens=, ?author=, ?api-version=)
    (re.compile(rf"(?i)([?&]{_CREDENTIAL_PARAM}=)[^&\s'\"#]+"), r"\1***"),
)
_MIN_ENV_SECRET_LEN = 8  # shorter values of such variables are flags ("true"), not secrets


def mask(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with each of ``secrets``, the value of every environment variable named as a secret
    (``*API_KEY*``, ``*_TOKEN*``...) and every credential-shaped string (a bearer token, an ``sk-...`` key, an
    address's ``user:password@``, a query parameter named as a credential) replaced by ``***``."""
    found = set(secrets)
    found.update(v for k, v in os.environ.items() if _SECRET_ENV.search(k) and len(v) >= _MIN_ENV_SECRET_LEN)
    for secret in sorted(found, key=len, reverse=True):  # the longest first: no part of one left showing
        if secret:
            text = text.replace(secret, "***")
    for shape, replacement in _SECRET_SHAPES:
        text = shape.sub(replacement, text)
    return text
