"""``python -m pipelines``: the same command as the ``pipelines`` console script."""

from pipelines.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
