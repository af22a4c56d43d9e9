"""An app module that fails at import, for the CLI's error handling."""

import os

app = os.environ["PIPELINES_TEST_SURELY_UNSET_VARIABLE"]
