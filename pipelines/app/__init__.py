"""The App: the one handle users hold, a thin face over its parts (``from pipelines.app import App``).

- :mod:`~pipelines.app.face`: :class:`App` itself, each method one call to a part;
- :mod:`~pipelines.app.registry`: its pipelines, agents and output schemas by name;
- :mod:`~pipelines.app.runs`: starting runs (an agent's, a pipeline's, a message sent, a fork);
- :mod:`~pipelines.app.controls`: operating on them (steering, advancing, deleting, retention);
- :mod:`~pipelines.app.read_model`: what the web page, the CLI and services read (``app.read``).

The web page and the CLI import this package (and :mod:`pipelines.errors`), not the engine.
"""

from __future__ import annotations

from adapters.base import RetentionStore
from pipelines.app.face import App
from pipelines.app.read_model import ReadModel, page_cursor, parse_cursor, tags_of
from pipelines.app.registry import PipelineSource, TitledSource

__all__ = ["App", "PipelineSource", "ReadModel", "RetentionStore", "TitledSource", "page_cursor", "parse_cursor",
           "tags_of"]
