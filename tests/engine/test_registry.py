"""Named policies and what each can do, asked of the registry rather than by a policy's name."""

from __future__ import annotations

import pytest

from engine.consistency.registry import CHANGING_WORKERS, CONSISTENCY_MODELS, HANDOFF
from engine.errors import ConfigError
from engine.registry import Registry


def test_capabilities_are_asked_by_name_and_listed_in_registration_order() -> None:
    shapes: Registry[int] = Registry("shape")
    shapes.register("square", 4, "four sides", capabilities=frozenset({"tiles", "rolls-not"}))
    shapes.register("circle", 0, "no sides", capabilities=frozenset({"rolls"}))
    shapes.register("hexagon", 6, "six sides", capabilities=frozenset({"tiles"}))
    assert shapes.can("square", "tiles") and not shapes.can("circle", "tiles")
    assert shapes.able("tiles") == ("square", "hexagon")
    assert shapes.able("flies") == ()
    with pytest.raises(ConfigError,
                       match=r"unknown shape 'cube' \(known: square, circle, hexagon\)"):
        shapes.can("cube", "tiles")


def test_a_name_is_registered_once() -> None:
    shapes: Registry[int] = Registry("shape")
    shapes.register("square", 4, "four sides")
    with pytest.raises(ConfigError, match="shape 'square' is registered twice"):
        shapes.register("square", 5, "again")


def test_the_consistency_models_say_which_can_grow_and_which_can_hand_copies_over() -> None:
    # bsp and elastic count a fixed set of workers in every round; elastic's barriers come from
    # a timing history a handed-over copy cannot have
    assert CONSISTENCY_MODELS.able(CHANGING_WORKERS) == ("asp", "ssp", "bounded-delay", "dssp")
    assert CONSISTENCY_MODELS.able(HANDOFF) == ("bsp", "asp", "ssp", "bounded-delay", "dssp")


def test_a_lazy_policy_is_imported_when_first_built_and_not_before() -> None:
    import subprocess
    import sys

    code = ("import sys\n"
            "from engine.policies.optimizers import SERVER_OPTIMIZERS\n"
            "entry = SERVER_OPTIMIZERS.entry('adam')\n"
            "assert entry.summary and entry.implies['optimizer.lr'] == 0.001\n"
            "assert SERVER_OPTIMIZERS.can('sgd', 'anything') is False\n"
            "assert 'engine.server.optimizers' not in sys.modules\n"
            "build = SERVER_OPTIMIZERS.get('adam')\n"
            "assert 'engine.server.optimizers' in sys.modules\n"
            "assert build.__name__ == 'build_adam' and SERVER_OPTIMIZERS.get('adam') is build\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_lazy_name_that_does_not_resolve_fails_when_built() -> None:
    from engine.registry import Lazy

    kinds: Registry[object] = Registry("kind")
    kinds.register("ghost", Lazy("engine.errors:NoSuchThing"), "nowhere")
    assert kinds.names() == ("ghost",)  # listing it loads nothing
    with pytest.raises(AttributeError, match="NoSuchThing"):
        kinds.get("ghost")


def test_a_stand_in_is_registered_for_a_while_and_what_it_replaced_comes_back() -> None:
    shapes: Registry[int] = Registry("shape")
    shapes.register("square", 4, "four sides")
    with shapes.registered("square", 5, "a stand-in"), shapes.registered("circle", 0, "new"):
        assert shapes.get("square") == 5 and shapes.names() == ("square", "circle")
    assert shapes.get("square") == 4 and shapes.names() == ("square",)
    with pytest.raises(RuntimeError), shapes.registered("circle", 0, "gone again"):
        raise RuntimeError("the test failed")
    assert "circle" not in shapes
