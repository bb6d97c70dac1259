"""The coordinator is assembled from parts (recovery, scaling) that call each other through
``CoordinatorBase``'s declarations: every one of those must be defined by a real part, never
left to the base's placeholder."""

from __future__ import annotations

import inspect

from engine.roles.coordination import Coordinator
from engine.roles.peer import CoordinatorBase


def test_every_declared_helper_is_defined_by_a_part_of_the_coordinator() -> None:
    declared = [name for name, value in vars(CoordinatorBase).items()
                if inspect.isfunction(value)]
    assert {"fail", "_event", "_send", "_spawn", "_order", "_on_members_updated"} <= set(declared)
    for name in declared:
        owner = next(cls for cls in Coordinator.__mro__ if name in vars(cls))
        assert owner is not CoordinatorBase, f"{name} is only the base's placeholder"
