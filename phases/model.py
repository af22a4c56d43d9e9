"""The model seam: one method, ``complete(request) -> ModelResponse``.

A model is a litellm model string (wrapped by :class:`phases.litellm_model.LiteLLMModel`,
which imports litellm lazily) or any object with ``complete``, such as
:class:`pipelines.testing.ScriptedModel`. The response is journaled as the
turn's ``model`` step, so it must be plain JSON (a pydantic model here).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from phases.tool_calls import check_tool_calls
from pipelines.engine.models import NO_USAGE, Message, Usage

__all__ = ["Model", "ModelRequest", "ModelResponse", "ReadOnlyMessages", "is_secret_param", "looks_secret",
           "provider_of", "shown_address"]

# Parameter names whose values are secrets. "token(?!s)" keeps max_tokens and
# friends visible while catching access_token, id_token and the like.
_SECRET_NAME = re.compile(r"key|token(?!s)|secret|passw|auth|bearer|credential|cookie|session", re.IGNORECASE)
# Every header value is treated as secret: auth schemes vary by provider.
_HEADER_PARAMS = frozenset({"headers", "extra_headers", "default_headers"})


def is_secret_param(name: str) -> bool:
    """Whether a model parameter named ``name`` holds a secret (a key, a token, a password, headers, ...).

    The one rule for every place that shows or logs model parameters: error messages, a model's
    ``safe_params``, the request a turn keeps in short.
    """
    return name.lower() in _HEADER_PARAMS or bool(_SECRET_NAME.search(name))


_SECRET_VALUE = re.compile(r"\s*(bearer|basic|token)\s|\s*sk[-_]", re.IGNORECASE)  # an auth header's or a key's shape


def looks_secret(value: str) -> bool:
    """Whether a parameter's value has the shape of a credential (``Bearer ...``, ``sk-...``), whatever its name."""
    return bool(_SECRET_VALUE.match(value))


def shown_address(text: str) -> str:
    """``text`` without the user, password, query string and fragment of an address in it (else as it is).

    How every place that shows or logs a model's parameters shows an address (``api_base``): a gateway's
    token can sit in its query string (``?key=``, ``?access_token=``, ``?sig=``) or its user part.
    """
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text
    host, slash, path = rest.partition("/")
    host = host.rsplit("@", 1)[-1]
    path, query, _ = path.partition("?")
    if not query and "#" in path:
        path = path.split("#", 1)[0]
    return f"{scheme}://{host}{slash}{path}" + ("?[hidden]" if query else "")


# litellm's provider prefixes whose GenAI convention name differs or is dotted; any other prefix is kept as it is.
_PROVIDERS = {"bedrock": "aws.bedrock", "bedrock_converse": "aws.bedrock", "azure": "azure.ai.openai",
              "azure_ai": "azure.ai.inference", "gemini": "gcp.gemini", "vertex_ai": "gcp.vertex_ai",
              "vertex_ai_beta": "gcp.vertex_ai", "mistral": "mistral_ai", "xai": "x_ai", "watsonx": "ibm.watsonx.ai",
              "moonshot": "moonshot_ai"}


def provider_of(model: object) -> str | None:
    """``gen_ai.provider.name`` for a model (telemetry): that of a litellm model string's prefix
    (``"openai/gpt-4o"`` -> ``"openai"``, ``"bedrock/..."`` -> ``"aws.bedrock"``); ``None`` for a string without
    one, or any other model (the library does not guess which provider a custom model calls)."""
    # Known by its class's name: importing phases.litellm_model here would load it for apps with no litellm model.
    litellm = ("phases.litellm_model", "LiteLLMModel")
    if not any((c.__module__, c.__name__) == litellm for c in type(model).__mro__):
        return None
    name = getattr(model, "model", None)
    if not isinstance(name, str) or "/" not in name:
        return None
    prefix = name.split("/", 1)[0].strip().lower()
    return _PROVIDERS.get(prefix, prefix) or None


@dataclass(frozen=True)
class ModelRequest:
    """What the agent turn asks a model. Never persisted (``params`` may hold secrets)."""

    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    job_id: str = ""
    turn: int = 0
    # Ask the provider for JSON matching this model (litellm ``response_format``);
    # only sent when no tools are offered, since some models then skip the tools.
    response_format: type[BaseModel] | None = None
    # A streaming model calls this with each piece of text as it arrives (None: do not stream).
    on_delta: Callable[[str], None] | None = None
    # A provider stream that breaks after it started may be retried this many times as the same
    # call; the model calls on_restart() first, so readers drop the abandoned attempt's text.
    stream_retries: int = 0
    on_restart: Callable[[], None] | None = None


class ModelResponse(BaseModel):
    """One model answer, as journaled: the assistant message in OpenAI chat format.

    ``message`` keeps every field the provider returned (reasoning/thinking
    blocks included) except ``None`` values, so it round-trips to the next call.
    """

    message: Message
    finish_reason: str | None = None
    usage: Usage = NO_USAGE  # shared: Usage is frozen (and a dump that leaves defaults out makes none)
    model: str | None = None
    # The tools offered for this call when a prepare_turn hook narrowed them
    # (None: all of the agent's tools); journaled so a replay runs the same set.
    tools_offered: list[str] | None = None
    # What was sent, in short (journaled with the answer, so an attempt that reuses it tells the same):
    # the number of messages, the names of the tools offered, the parameters with secrets left out.
    request: dict[str, Any] | None = None
    # The provider's response around the message, as it came (its id, created, model, system fingerprint, the
    # usage with every detail, each choice's finish reason and index; the message itself is ``message``): what
    # the model-call view shows. None for a model with no provider response (ScriptedModel).
    raw: dict[str, Any] | None = None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The answer's tool calls; ``PermanentModelError`` naming ``tool_calls`` if they are not a list."""
        return check_tool_calls(self.message.get("tool_calls"))


@runtime_checkable
class Model(Protocol):
    """Anything that can answer a :class:`ModelRequest`; ``complete`` may be ``async def``.

    ``request.messages`` is the model's own copy: it may change it in place (add a provider's cache
    marker, say). A model that never does, or changes only a copy it makes, can say so by also
    inheriting :class:`ReadOnlyMessages`, and is then handed the transcript's own messages, uncopied.
    """

    def complete(self, request: ModelRequest) -> ModelResponse | Awaitable[ModelResponse]: ...


class ReadOnlyMessages:
    """A base for a :class:`Model` that never changes ``request.messages`` in place (or only a copy it makes).

    The agent turn then hands it the very message dicts of the worker's transcript cache, saving a copy
    of the transcript at every call. Any other model gets a copy of its own: a change made in place would
    otherwise reach later turns on the same worker (not on another one) and the messages the turn commits.
    :class:`~phases.litellm_model.LiteLLMModel` and :class:`~pipelines.testing.ScriptedModel` inherit it.
    """
