"""`python -m bench.ui_pages_bench` (figure 15 of `make bench`) runs to the end on a small store and prints every
line (no speed is asserted, ever)."""

from __future__ import annotations

import contextlib
import io

import pytest

from bench import ui_pages_bench

pytestmark = [pytest.mark.system]


@pytest.mark.timeout(120)
def test_the_web_page_bench_prints_time_and_bytes_for_every_request() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert ui_pages_bench.main(["--jobs", "300", "--repeat", "1", "--storages", "sqlite"]) == 0
    text = out.getvalue()
    assert "sqlite: 300 job records stored" in text and "1201 messages" in text
    for line in ("jobs page ", "live refresh (50 rows)", "deep (cursor)", "jobs search", "job page (1201 messages)",
                 "job page, live refresh after an event"):
        assert line in text, text
    assert text.count(" KiB") == 6
