"""The suite's warning filters (pyproject.toml): errors, but an open event loop and its self-pipe (untraced)."""

from __future__ import annotations

import warnings

import pytest


def test_a_loops_self_pipe_and_the_loop_are_not_errors() -> None:
    # Under the suite's own filters (active in every test), neither raises; without them both would.
    warnings.warn("unclosed event loop <_UnixSelectorEventLoop running=False closed=False debug=False>",
                  ResourceWarning, stacklevel=1)
    warnings.warn("unclosed <socket.socket fd=27, family=1, type=1, proto=0>", ResourceWarning, stacklevel=1)


@pytest.mark.parametrize("message", [
    "unclosed <socket.socket fd=18, family=2, type=1, proto=6, laddr=('127.0.0.1', 52268)>",  # a TCP connection
    "unclosed file <_io.TextIOWrapper name='x' mode='r' encoding='UTF-8'>",
])
def test_any_other_resource_left_open_is_an_error(message: str) -> None:
    with pytest.raises(ResourceWarning, match="unclosed"):
        warnings.warn(message, ResourceWarning, stacklevel=1)
