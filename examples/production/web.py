"""What a web request does: write the job and enqueue its first turn, then return at once.

    python -m examples.production.web "Where is my order A-1001?" [--job JOB_ID]

Reading the answer later is a storage read (``pipelines status JOB`` /
``pipelines transcript JOB`` from a shell).
"""

from __future__ import annotations

import argparse
import uuid

from examples.production.app import app


def start_conversation(text: str, job_id: str | None = None) -> str:
    """Enqueue a support conversation (or continue a finished one with the same id); returns the job id."""
    job_id = job_id or f"support-{uuid.uuid4().hex[:12]}"
    return app.run_agent("support", job_id=job_id, messages=[text]).job_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("text")
    parser.add_argument("--job")
    args = parser.parse_args()
    print(start_conversation(args.text, args.job))


if __name__ == "__main__":
    main()
