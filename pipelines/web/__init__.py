"""HTTP for a job's live stream (the ``phaserunner[web]`` extra: Starlette, uvicorn).

:func:`sse_response` serves a job's stream as Server-Sent Events, as the
library's own parts (``format="parts"``) or as the Vercel AI SDK UI message
stream (``format="ai-sdk"``, for ``useChat`` and ``readUIMessageStream``)::

    from pipelines.web import sse_response

    async def stream(request):
        return sse_response(app, request.path_params["id"], request, format="ai-sdk")
"""

from pipelines.web.aisdk import UIMessageEncoder
from pipelines.web.sse import HEARTBEAT_SECONDS, JobStreamResponse, StreamFormat, sse_response

__all__ = ["HEARTBEAT_SECONDS", "JobStreamResponse", "StreamFormat", "UIMessageEncoder", "sse_response"]
