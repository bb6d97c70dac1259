"""psctl: launch parameter-server training runs, watch them, compare them.

This package is the command line. It must stay free of torch so that it starts fast; a test
enforces it. Everything heavy happens in the processes that ``psctl launch`` starts.

One function here is for the user's own code instead: ``psctl.log(name, value)``, called from a
model or data file, records a metric of its own with the run (see docs/models.md).
"""

import time

# When the command line's code began to load: its start where the process's own start is older
# (engine.proctime.program_started_at).
IMPORTED_AT = time.time()

from engine.usermetrics import log  # noqa: E402 -- after the clock reading above

__all__ = ["log"]
__version__ = "0.1.0"
