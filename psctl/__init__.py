"""psctl: launch parameter-server training runs, watch them, compare them.

This package is the command line. It must stay free of torch so that it starts fast; a test
enforces it. Everything heavy happens in the processes that ``psctl launch`` starts.

One function here is for the user's own code instead: ``psctl.log(name, value)``, called from a
model or data file, records a metric of its own with the run (see docs/models.md).
"""

from engine.usermetrics import log

__all__ = ["log"]
__version__ = "0.1.0"
