"""`python -m handles.cli`: the `handles` command, as the console script runs it."""

from __future__ import annotations

import sys

from handles.cli import main

sys.exit(main())
