"""The ``slea`` command line: it parses and calls, nothing more.

A bad config, argument, path or missing extra is one line on stderr and exit code 2 (no traceback); a run halted
by a reliability guard is exit code 3. Progress and results go through :mod:`slea.progress` (a rich display on a
terminal, plain timestamped lines in logs). ``slea`` and ``python -m slea.cli`` run :data:`app`.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded at run time
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from slea.cli.main import app, main

__all__ = ["app", "main"]
