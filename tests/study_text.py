"""Pieces of study files that tests write (``psctl study FILE``): the axis most of them vary."""

from __future__ import annotations


def sync_axis(*models: str) -> str:
    """A ``sync`` axis whose values are these consistency models, labelled in capitals."""
    values = "".join(f'  [[axis.values]]\n  label = "{model.upper()}"\n'
                     f'  set = {{ "sync.model" = "{model}" }}\n' for model in models)
    return f'[[axis]]\nname = "sync"\n{values}'
