"""The regime every backend takes (``regime``: --compute-ms, --network, --server-network), the
settings only one backend reads (refused elsewhere, never ignored), and stored runs written
before the regime had its own section."""

from __future__ import annotations

from typing import Any

import pytest

from engine.config import RunConfig, upgraded
from engine.errors import ConfigError
from engine.plan import build_config, parse_config

DIGITS = {"data.dataset": "digits"}


@pytest.mark.parametrize("backend", ["local", "ray", "sim"])
def test_the_regime_is_every_backends(backend: str) -> None:
    config = build_config({}, DIGITS | {"cluster.backend": backend, "regime.compute_ms": 100.0,
                                        "regime.network": "100MBit:5ms",
                                        "regime.server_network": "1gbit:1ms"})
    assert config.regime.compute_ms == 100.0
    assert (config.regime.network, config.regime.server_network) == ("100mbit:5ms",
                                                                      "1gbit:1ms")


@pytest.mark.parametrize(("given", "says"), [
    ({"sim.server_ms": 2.0}, r"sim.server_ms applies to the sim backend only, and this run's is "
                             r"local \(--backend sim, or leave it out\)"),
    ({"sim.costs": "given", "sim.server_ms": 1.0}, "sim.costs, sim.server_ms apply to the sim"),
    ({"ray.placement": "pack"}, "ray.placement applies to the ray backend only"),
])
def test_a_setting_of_another_backend_is_refused(given: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        build_config({}, DIGITS | given)


@pytest.mark.parametrize(("given", "says"), [
    ({"sim.costs": "given"}, "sim.costs given needs regime.compute_ms and sim.server_ms"),
    ({"sim.costs": "given", "regime.compute_ms": 5.0, "sim.server_ms": 1.0, "sim.cores": 2},
     "sim.cores is for measured costs"),
])
def test_given_costs_are_whole(given: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        build_config({}, DIGITS | {"cluster.backend": "sim"} | given)


def test_a_file_naming_the_old_keys_is_told_where_they_went() -> None:
    with pytest.raises(ConfigError, match=r"sim.network: moved to regime.network.*"
                                          r"sim.compute: is gone"):
        build_config({"sim": {"network": "1gbit:1ms", "compute": "given"}}, DIGITS)


def test_a_stored_simulated_run_keeps_its_regime() -> None:
    old = RunConfig().to_json_dict()
    old.pop("regime")
    old["cluster"]["backend"] = "sim"
    old["data"]["dataset"] = "digits"
    old["sim"] = {"compute": "given", "compute_ms": 50.0, "network": "1gbit:1ms",
                  "server_network": None, "server_ms": 2.0}
    config = parse_config(upgraded(old))
    assert (config.regime.compute_ms, config.regime.network) == (50.0, "1gbit:1ms")
    assert config.sim.server_ms == 2.0


def test_a_stored_real_run_does_not_take_the_simulators_old_default_network() -> None:
    old = RunConfig().to_json_dict()
    old.pop("regime")
    old["data"]["dataset"] = "digits"
    old["sim"] = {"compute": "measured", "compute_ms": None, "network": "10gbit:50us",
                  "server_network": None, "server_ms": None}
    config = parse_config(upgraded(old))  # psctl resume of a run recorded before the move
    assert config.regime.network is None and config.regime.compute_ms is None
    assert upgraded(config.to_json_dict()) == config.to_json_dict()  # a new one is as it is
