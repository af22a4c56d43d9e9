"""Shared model rate limits around one model call (the App's ``rate_limits``, see :mod:`pipelines.engine.flow`).

Before the call: estimate its tokens and take them, with one request, from
the model's shared bucket; if the bucket cannot give them now, raise
:class:`~pipelines.engine.flow.FlowDeferred` with the wait, so the runner
reschedules the turn and the worker moves on (no sleep, no attempt spent).
After it: correct the estimate with the real usage. A provider's 429 with
Retry-After blocks the model for every worker for that long.

A journaled answer is replayed without any of this: it costs the provider nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from pipelines.engine import flow
from pipelines.engine.errors import TransientModelError

__all__ = ["estimate_tokens", "limited_call", "model_name"]


def model_name(model: object) -> str | None:
    """The name a :class:`~pipelines.engine.flow.RateLimit` matches: the model's ``model`` or ``name``."""
    for attr in ("model", "name"):
        value = getattr(model, attr, None)
        if isinstance(value, str) and value:
            return value
    return None


def estimate_tokens(model: object, messages: Sequence[Mapping[str, Any]]) -> int:
    """Tokens a request will use, before the call: litellm's counter for litellm models, else ~4 characters a token.

    litellm is imported only for a litellm model (which has loaded it
    already), so other models never pay for its import.
    """
    name = model_name(model)
    if type(model).__name__ == "LiteLLMModel" and name is not None:
        try:
            import litellm  # lazy: only litellm models get here

            return int(litellm.token_counter(model=name, messages=list(messages)))
        except Exception:  # noqa: BLE001 - an unknown model or message shape: the cheap estimate will do
            pass
    chars = sum(len(str(m.get("content") or "")) + len(str(m.get("tool_calls") or "")) for m in messages)
    return max(1, chars // 4)


def _no_settle(used: int) -> None:
    """What a call with no rate limit settles: nothing."""


# Reusable (it holds no state): a model with no limit, the usual case, makes no context manager a call.
_UNLIMITED = nullcontext(_no_settle)


def limited_call(control: flow.FlowControl | None, model: object,
                 messages: Sequence[Mapping[str, Any]]) -> AbstractContextManager[Callable[[int], None]]:
    """Hold the model's budget around one call; yields ``settle(total_tokens)`` to call with the real usage.

    ``control``: the App's flow control, as the turn's environment hands it (``ctx.env.active_flow()``).

    Raises :class:`~pipelines.engine.flow.FlowDeferred` before the call when
    the budget is spent; a :class:`TransientModelError` with ``retry_after``
    from the call blocks the model for everyone, then propagates.
    """
    if control is None or not control.limits:
        return _UNLIMITED
    name = model_name(model)
    if name is None or name not in control.limits:
        return _UNLIMITED
    return _limited(control, name, model, messages)


@contextmanager
def _limited(control: flow.FlowControl, name: str, model: object,
             messages: Sequence[Mapping[str, Any]]) -> Iterator[Callable[[int], None]]:
    estimated = estimate_tokens(model, messages)
    wait = control.before_call(name, estimated, control.clock())
    if wait > 0:
        raise flow.FlowDeferred(wait, f"rate limit of {name}: budget back in {wait:.2f}s")
    try:
        yield lambda used: control.after_call(name, estimated, used)
    except TransientModelError as exc:
        if exc.retry_after is not None:
            control.throttled(name, exc.retry_after, control.clock())
        raise
