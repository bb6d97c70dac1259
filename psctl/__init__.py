"""psctl: launch parameter-server training runs, watch them, compare them.

This package is the command line. It must stay free of torch so that it starts fast; a test
enforces it. Everything heavy happens in the processes that ``psctl launch`` starts.
"""

__version__ = "0.1.0"
