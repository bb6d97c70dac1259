"""psctl/launch.py's composition of a run before anything starts: a layout of sparse and dense
keys gets a key range of each kind where the run does not say how many (issue 44)."""

from __future__ import annotations

import pytest

from engine.errors import ConfigError
from psctl.launch import compose

CLICKS = {"data.dataset": "sparse-synthetic:features=2^30,nnz=20,samples=1000,ctr=0.2",
          "model.name": "embedding", "cluster.workers": 2}


def test_the_embedding_model_on_one_server_gets_a_key_range_of_each_kind() -> None:
    config = compose({}, {**CLICKS, "cluster.servers": 1})
    assert (config.cluster.servers, config.cluster.key_ranges) == (1, 2)
    assert config.optimizer.name == "adagrad"  # what the model implies


@pytest.mark.parametrize(("servers", "ranges", "want"), [(2, None, None), (3, None, None),
                                                         (2, 4, 4)])
def test_enough_ranges_or_said_ones_are_kept(servers: int, ranges: int | None,
                                             want: int | None) -> None:
    config = compose({}, {**CLICKS, "cluster.servers": servers, "cluster.key_ranges": ranges})
    assert config.cluster.key_ranges == want


def test_too_few_ranges_said_are_refused() -> None:
    with pytest.raises(ConfigError, match="needs at least 2 key ranges"):
        compose({}, {**CLICKS, "cluster.servers": 1, "cluster.key_ranges": 1})


def test_a_layout_of_one_kind_keeps_one_range_a_server() -> None:
    config = compose({}, {"data.dataset": "sparse-synthetic:features=2^30,nnz=20",
                          "model.name": "logreg", "cluster.servers": 1})
    assert config.cluster.key_ranges is None and config.cluster.ranges == 1


def test_a_backend_that_serves_one_range_a_server_says_to_add_servers() -> None:
    with pytest.raises(ConfigError, match=r"needs 2 key ranges .* give --servers 2 \(.*"
                                          r"sim does not model cluster.key_ranges"):
        compose({}, {**CLICKS, "cluster.servers": 1, "cluster.backend": "sim"})
    simulated = compose({}, {**CLICKS, "cluster.servers": 2, "cluster.backend": "sim"})
    assert simulated.cluster.ranges == 2
