"""engine.plan composes a run: what the policies imply, the schema, names, canonical specs, and
each chosen policy's rules."""

from __future__ import annotations

from typing import Any

import pytest

from engine.config import RunConfig
from engine.consistency.base import ASP
from engine.consistency.registry import CONSISTENCY_MODELS
from engine.errors import ConfigError
from engine.plan import build_config, parse_config


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"sync": {"model": "nope"}, "optimizer": {"name": "sgdd"}})
    message = str(caught.value)
    assert message.startswith("invalid configuration: sync.model: unknown consistency model "
                              "'nope' (known: bsp, asp, ssp, bounded-delay, dssp, elastic)")
    assert "optimizer.name: unknown server optimizer 'sgdd'" in message


def test_the_schema_speaks_before_the_policies() -> None:
    with pytest.raises(ConfigError, match="cluster.workers: Input should be greater than or "
                                          "equal to 1"):
        parse_config({"cluster": {"workers": 0}, "sync": {"model": "nope"}})


def test_what_a_policy_implies_fills_in_only_what_the_run_leaves_out() -> None:
    lbfgs = build_config({}, {"optimizer.name": "lbfgs"})
    assert (lbfgs.sync.model, lbfgs.sync.push_scale, lbfgs.optimizer.lr) == ("asp", "sum", 1.0)
    with pytest.raises(ConfigError, match="optimizer lbfgs .* does not take sync.model bsp"):
        build_config({}, {"optimizer.name": "lbfgs", "sync.model": "bsp"})
    adam = build_config({"optimizer": {"name": "adam", "lr": 0.01}}, {"optimizer.lr": None})
    assert adam.optimizer.lr == 0.01  # a flag not given leaves the file's value


def test_specs_are_stored_in_their_canonical_spelling() -> None:
    config = build_config({}, {"comm.prune": "topk:1%",
                               "fault.inject": ["KILL:worker:1@5"],
                               "comm.pull_filter": "significant:0.010"})
    assert config.fault.inject == ("kill:worker:1@5",)
    assert config.comm.pull_filter == "significant:0.01"
    assert config.comm.prune == build_config({}, {"comm.prune": config.comm.prune}).comm.prune
    with pytest.raises(ConfigError, match="comm.prune: "):
        build_config({}, {"comm.prune": "topk:200%"})


@pytest.mark.parametrize(("given", "says"), [
    # the overlapped loop's rule holds where another loop was named
    ({"train.overlap": True, "train.loop": "plain", "sync.model": "ssp"},
     "train.overlap needs asp; ssp must wait for its pulls"),
    ({"train.fetch_every": 4, "sync.model": "bsp"}, "Downpour's asynchronous settings"),
    ({"train.loop": "delayed", "sync.model": "ssp"}, "bounded-delay runs the delayed loop"),
    ({"train.loop": "plain", "sync.model": "bounded-delay"},
     "bounded-delay runs the delayed loop"),
    ({"learning.schedule": "step"}, "learning.schedule step needs learning.step_every"),
    ({"cluster.backend": "sim", "comm.compress": "lz4"}, "sim does not model comm.compress"),
    ({"fault.inject": ["kill:worker:9@1"]}, "there is no worker 9"),
])
def test_each_chosen_policy_asks_its_rules(given: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        build_config({}, given)


def test_a_registered_rule_is_asked_only_for_its_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    def needs_one_server(run: RunConfig) -> None:
        if run.cluster.servers != 1:
            raise ValueError(f"sync.model toy keeps one server, not {run.cluster.servers}")

    monkeypatch.setattr(CONSISTENCY_MODELS, "_entries", dict(CONSISTENCY_MODELS._entries))
    CONSISTENCY_MODELS.register("toy", lambda sync, workers, ranges: ASP(workers), "a toy",
                                requires=(needs_one_server,))
    with pytest.raises(ConfigError, match="sync.model toy keeps one server, not 2"):
        build_config({}, {"sync.model": "toy"})
    assert build_config({}, {"sync.model": "toy", "cluster.servers": 1}).sync.model == "toy"
    assert build_config({}, {"sync.model": "asp"}).cluster.servers == 2  # nobody else's rule


def test_a_role_reads_the_composed_run_back_unchanged() -> None:
    config = build_config({}, {"data.dataset": "sparse-synthetic", "train.seed": 3})
    assert config.sync.model == "bounded-delay" and config.model.name == "logreg"
    assert RunConfig.model_validate(config.to_json_dict()) == config
    assert parse_config(config.to_json_dict()) == config


def test_a_policys_own_settings_live_in_its_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import BaseModel, ConfigDict, Field

    class Knobs(BaseModel):
        model_config = ConfigDict(frozen=True, extra="forbid")
        knob: int = Field(3, ge=1)

    monkeypatch.setattr(CONSISTENCY_MODELS, "_entries", dict(CONSISTENCY_MODELS._entries))
    CONSISTENCY_MODELS.register("knobbed", lambda sync, workers, ranges: ASP(workers), "a toy",
                                settings=Knobs)
    chosen = build_config({}, {"sync.model": "knobbed"})
    assert chosen.to_json_dict()["sync"]["knobbed"] == {"knob": 3}  # its defaults, written out
    assert CONSISTENCY_MODELS.settings_of("knobbed", chosen.sync, Knobs).knob == 3
    given = build_config({"sync": {"model": "knobbed", "knobbed": {"knob": 5}}}, {})
    assert CONSISTENCY_MODELS.settings_of("knobbed", given.sync, Knobs).knob == 5
    with pytest.raises(ConfigError, match=r"sync\.knobbed\.knob: Input should be greater than "
                                          r"or equal to 1 \(got 0\)"):
        build_config({}, {"sync.model": "knobbed", "sync.knobbed.knob": 0})
    with pytest.raises(ConfigError, match=r"sync\.knobbed\.kbob: Extra inputs"):
        build_config({}, {"sync.model": "knobbed", "sync.knobbed.kbob": 1})
    with pytest.raises(ConfigError, match=r"sync\.stalenes: no such setting"):
        build_config({"sync": {"stalenes": 3}}, {})
    assert build_config({"sync": {"knobbed": {"knob": 2}}}, {}).sync.model == "bsp"  # kept


SPARSE = "sparse-synthetic:features=1000,nnz=5,samples=200,test=50"


def test_the_embedding_model_implies_adagrad_at_its_own_rate_unless_the_run_says() -> None:
    implied = build_config({}, {"data.dataset": SPARSE, "model.name": "embedding"})
    assert (implied.optimizer.name, implied.optimizer.lr) == ("adagrad", 0.005)
    spelled = build_config({}, {"data.dataset": SPARSE, "model.name": " Embedding "})
    assert (spelled.model.name, spelled.optimizer.name) == ("embedding", "adagrad")
    # The user's word wins, a flag's or a file's; a rate given keeps the implied optimizer.
    given: list[tuple[dict[str, Any], dict[str, Any], tuple[str, float]]] = [
        ({}, {"optimizer.name": "sgd"}, ("sgd", 0.1)),
        ({}, {"optimizer.lr": 0.01}, ("adagrad", 0.01)),
        ({"optimizer": {"name": "adam"}}, {}, ("adam", 0.001)),
        ({"optimizer": {"lr": 0.05}}, {"optimizer.name": "sgd"}, ("sgd", 0.05))]
    for values, flags, kept in given:
        config = build_config(values, {"data.dataset": SPARSE, "model.name": "embedding",
                                       **flags})
        assert (config.optimizer.name, config.optimizer.lr) == kept, (values, flags)
    # Another model of sparse samples implies nothing of the optimizer.
    logreg = build_config({}, {"data.dataset": SPARSE})
    assert (logreg.model.name, logreg.optimizer.name, logreg.optimizer.lr) == ("logreg", "sgd",
                                                                                0.1)


def test_what_a_model_implies_is_declared_by_its_registration() -> None:
    from engine.models.kinds import MODELS, BuiltinModel
    from engine.registry import Lazy

    assert MODELS.implied("embedding") == {"optimizer.name": "adagrad"}
    with MODELS.registered("toy", BuiltinModel(Lazy("engine.models.spec:mlp_layout"), None),
                           "a toy", implies={"optimizer.name": "rmsprop", "sync.model": "asp"}):
        config = build_config({}, {"model.name": "toy", "data.dataset": "digits"})
        assert (config.optimizer.name, config.optimizer.lr, config.sync.model) == (
            "rmsprop", 0.0005, "asp")


def test_a_models_own_settings_live_in_its_table() -> None:
    chosen = build_config({}, {"data.dataset": SPARSE, "model.name": "embedding"})
    assert chosen.to_json_dict()["model"]["embedding"] == {"dim": 8}  # its defaults, written out
    given = build_config({"model": {"name": "embedding", "embedding": {"dim": 4}}},
                         {"data.dataset": SPARSE})
    assert given.to_json_dict()["model"]["embedding"] == {"dim": 4}
    assert parse_config(given.to_json_dict()) == given
    for dim, says in ((0, "greater than or equal to 1"), (257, "less than or equal to 256")):
        with pytest.raises(ConfigError, match=rf"model\.embedding\.dim: Input should be {says}"):
            build_config({}, {"data.dataset": SPARSE, "model.name": "embedding",
                              "model.embedding.dim": dim})
    with pytest.raises(ConfigError, match=r"model\.embedding\.dims: Extra inputs"):
        build_config({}, {"model.embedding.dims": 4})
    with pytest.raises(ConfigError, match=r"model\.hiden: no such setting"):
        build_config({"model": {"hiden": [32]}}, {})
    # As a policy's table, another model's is kept, not refused: a study may vary the model.
    kept = build_config({}, {"data.dataset": SPARSE, "model.embedding.dim": 4})
    assert kept.model.name == "logreg" and kept.to_json_dict()["model"]["embedding"] == {"dim": 4}
