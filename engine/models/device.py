"""``--device auto|cpu|cuda[:N]``: where workers and the evaluator compute.

``auto`` takes the first GPU when torch sees one. Asking for ``cuda`` where there is none fails at
once with what was found: the launcher checks before starting anything (``check_here``, in a short
child process, because the CLI never imports torch), and each role checks again where it runs.
"""

from __future__ import annotations

import subprocess
import sys

from engine.errors import ConfigError

CHECK_TIMEOUT_S = 60.0


def resolve(setting: str) -> str:
    """The torch device for ``setting`` in this process; ConfigError when it has no such GPU."""
    import torch

    if setting == "cpu":
        return "cpu"
    available = torch.cuda.is_available()
    if setting == "auto":
        return "cuda" if available else "cpu"
    count = torch.cuda.device_count() if available else 0
    index = int(setting.partition(":")[2] or 0)
    if index >= count:
        built = torch.version.cuda or "none (a CPU-only build)"
        raise ConfigError(
            f"--device {setting}: torch sees {count} CUDA GPU(s) here (torch {torch.__version__}, "
            f"CUDA {built}); use --device cpu, or --device auto to take a GPU only when there is "
            "one")
    return setting


def check_here(setting: str) -> None:
    """``resolve`` in a child process, so that the caller need not import torch."""
    if setting in ("auto", "cpu"):
        return
    try:
        done = subprocess.run([sys.executable, "-m", "engine.models.device", setting],
                              capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise ConfigError(f"--device {setting}: checking for a GPU took over "
                          f"{CHECK_TIMEOUT_S:g} s") from exc
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise ConfigError(lines[-1] if lines else f"--device {setting}: the check failed")


def main() -> int:
    try:
        print(resolve(sys.argv[1]))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
