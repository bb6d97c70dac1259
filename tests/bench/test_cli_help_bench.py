"""bench/cli_help.py's summary and its reading of -X importtime, in process."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import cli_help  # noqa: E402


def test_medians_per_command() -> None:
    passes = [{"help": 0.3, "launch_help": 0.4}, {"help": 0.2, "launch_help": 0.5},
              {"help": 0.25, "launch_help": 0.45}]
    assert cli_help.summarise(passes) == {"help": 0.25, "launch_help": 0.45}


def test_heavy_modules_are_read_from_importtime() -> None:
    text = ("import time: self [us] | cumulative | imported package\n"
            "import time:       100 |        100 |   engine.config\n"
            "import time:       200 |        900 |     engine.server.learning\n"
            "import time:        50 |         50 | numpy._core\n"
            "import time:        10 |         10 |   engine.serverless\n")
    assert cli_help.heavy(text) == ["engine.server.learning", "numpy._core"]
