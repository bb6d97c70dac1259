"""psctl launch's options are made from the settings' fields: each flag sets its own setting
(--momentum is optimizer.momentum, ...), resolved to a run's configuration in process by the
options the launch command parsed. The expected settings are written out here, not read from
the fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest
import typer
import typer.main

from engine.config import RunConfig
from psctl.cli import app
from psctl.launch_options import launch_config, launch_overrides, setting_options

LAUNCH = typer.main.get_command(app).commands["launch"]  # type: ignore[attr-defined]

# flag -> (value given, where the run's configuration must hold it); values are distinct and
# none is a default, so a flag wired to another setting (or to none) shows.
FLAGS: dict[str, tuple[Any, tuple[str, str]]] = {
    "--lr": (0.125, ("optimizer", "lr")),
    "--momentum": (0.375, ("optimizer", "momentum")),
    "--clip-norm": (7.5, ("optimizer", "clip_norm")),
    "--max-seconds": (321.0, ("stop", "max_seconds")),
    "--target-accuracy": (0.625, ("stop", "target_accuracy")),
    "--eval-interval": (4.5, ("eval", "interval_s")),
    "--workers": (3, ("cluster", "workers")),
    "--servers": (2, ("cluster", "servers")),
    "--epochs": (4, ("train", "epochs")),
    "--seed": (17, ("train", "seed")),
    "--range": (6, ("sync", "range")),
    "--aggregation": ("sum", ("sync", "push_scale")),
    "--lbfgs-history": (7, ("optimizer", "history")),
    "--checkpoint-every": (33.0, ("fault", "checkpoint_every_s")),
}


def configured(args: list[str], tmp_path: Path) -> RunConfig:
    # digits: resolving the configuration looks for the data set, and digits needs no files.
    options = LAUNCH.make_context("psctl launch", ["--dataset", "digits", "--no-config", *args])
    return launch_config(options.params, tmp_path / "experiments.db")


@pytest.mark.parametrize("flag", sorted(FLAGS))
def test_a_launch_flag_sets_its_own_setting_and_no_other(flag: str, tmp_path: Path) -> None:
    value, (section, field) = FLAGS[flag]
    default = configured([], tmp_path)
    config = configured([flag, str(value)], tmp_path)
    assert getattr(getattr(config, section), field) == value
    # Nothing else moved: the configuration is the default one with this setting changed.
    changed = default.model_copy(update={section: getattr(default, section).model_copy(
        update={field: value})})
    assert config == changed


def test_every_flag_at_once_keeps_each_value_apart(tmp_path: Path) -> None:
    config = configured([word for flag, (value, _) in FLAGS.items() for word in (flag, str(value))],
                        tmp_path)
    got = {flag: getattr(getattr(config, section), field)
           for flag, (_, (section, field)) in FLAGS.items()}
    assert got == {flag: value for flag, (value, _) in FLAGS.items()}


def test_switches_repeats_and_sugar(tmp_path: Path) -> None:
    config = configured(["--no-pipeline", "--fault", "kill:worker:1@5", "--fault", "drop:1%",
                         "--name", "r1", "--data-dir", str(tmp_path)], tmp_path)
    assert config.train.pipeline is False and config.name == "r1"
    assert config.fault.inject == ("kill:worker:1@5", "drop:1%")
    regime = configured(["--backend", "sim", "--compute-ms", "5", "--network", "1gbit:1ms"],
                        tmp_path).regime
    assert (regime.compute_ms, regime.network) == (5.0, "1gbit:1ms")


def test_every_launch_option_is_a_setting_or_one_of_the_few_others() -> None:
    params = {param.name for param in LAUNCH.params}
    settings = {option.param for option in setting_options()}
    assert params - settings == {"history", "straggler", "jitter", "lr_schedule", "config",
                                 "no_config", "db", "live", "ui", "repeat"}
    assert len(settings) == len(setting_options())  # no two settings share a flag
    assert settings <= params


def test_each_setting_option_overrides_its_own_setting() -> None:
    for option in setting_options():
        given = {option.param: ["x"] if option.many else "x"}
        changed = {key: value for key, value in launch_overrides(given).items()
                   if value is not None}
        assert changed == {option.setting: ("x",) if option.many else "x"}, option


def test_the_help_is_grouped_by_section_with_the_policies_listed() -> None:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["launch", "--help"], env={"COLUMNS": "200"})
    text = " ".join(result.output.split())
    sections = [line for line in result.output.splitlines() if line.endswith(" options:")]
    assert sections[0] == "Cluster options:" and sections[-1] == "Run options:"
    assert "Sync options:" in sections and "Optimizer options:" in sections
    assert "consistency model: bsp, asp, ssp, bounded-delay, dssp or elastic [bsp]" in text
    assert "server learning rate [the optimizer's own: sgd 0.1, adagrad 0.005" in text
    assert "worker loop: auto, plain, layered" in text


def _help_sections() -> dict[str, str]:
    """psctl launch --help, section title -> the text under it."""
    from typer.testing import CliRunner

    output = CliRunner().invoke(app, ["launch", "--help"], env={"COLUMNS": "200"}).output
    sections: dict[str, str] = {}
    title = ""
    for line in output.splitlines():
        if line.endswith(" options:") and not line.startswith(" "):
            title = line.removesuffix(" options:").lower()
        elif title:
            sections[title] = sections.get(title, "") + line + "\n"
    return sections


def test_every_setting_is_in_the_panel_of_its_section() -> None:
    import re

    sections = _help_sections()
    wanted = {option.section for option in setting_options()} | {"run"}
    assert wanted <= set(sections) and len(wanted) >= 10  # (--straggler: "heterogeneity")
    for option in setting_options():
        flags = re.findall(r"^\s+(--[a-z0-9-]+)", sections[option.section], re.MULTILINE)
        assert option.flag in flags, (option.flag, option.section)


def _completed(flag: str, typed: str = "") -> list[str]:
    """What a shell completes after ``psctl launch FLAG TYPED``, as bash asks for it."""
    from typer.testing import CliRunner

    done = CliRunner().invoke(app, [], prog_name="psctl", env={
        "_PSCTL_COMPLETE": "complete_bash", "COMP_WORDS": f"psctl launch {flag} {typed}",
        "COMP_CWORD": "3"})
    assert done.exit_code == 0, done.output
    return done.output.split()


def test_choice_options_complete_their_registered_values() -> None:
    from engine.backends import BACKENDS
    from engine.consistency.registry import CONSISTENCY_MODELS
    from engine.datasets.registry import DATASETS
    from engine.models.kinds import MODELS
    from engine.policies.optimizers import SERVER_OPTIMIZERS

    assert _completed("--sync") == list(CONSISTENCY_MODELS.names())
    assert _completed("--sync", "b") == [n for n in CONSISTENCY_MODELS.names() if n[0] == "b"]
    assert _completed("--backend") == list(BACKENDS.names())
    assert _completed("--optimizer") == list(SERVER_OPTIMIZERS.names())
    assert set(DATASETS.names()) <= set(_completed("--dataset"))
    assert _completed("--model") == list(MODELS.names())
    assert _completed("--compress") == list(get_args(
        RunConfig.model_fields["comm"].annotation.model_fields["compress"].annotation))
    assert _completed("--workers") == []  # a number: nothing to offer


def test_a_policy_registered_later_is_completed_too() -> None:
    from engine.consistency.registry import CONSISTENCY_MODELS

    with CONSISTENCY_MODELS.registered("zz-test-model", CONSISTENCY_MODELS.get("bsp"),
                                       "a stand-in"):
        assert "zz-test-model" in _completed("--sync", "zz")


@pytest.mark.parametrize("given", ["0.97", "97"])
def test_a_target_accuracy_is_a_fraction_or_a_percentage_everywhere(
        given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the command line, in a config file and in the environment, 97 means 97 %."""
    assert configured(["--target-accuracy", given], tmp_path).stop.target_accuracy == 0.97
    assert RunConfig.model_validate({"stop": {"target_accuracy": float(given)}}) \
        .stop.target_accuracy == 0.97
    monkeypatch.setenv("PSCTL_STOP__TARGET_ACCURACY", given)
    options = LAUNCH.make_context("psctl launch", ["--dataset", "digits"])
    assert launch_config(options.params, tmp_path / "experiments.db").stop.target_accuracy \
        == 0.97


def test_a_target_past_100_percent_is_refused_in_a_config_too() -> None:
    with pytest.raises(ValueError, match="less than or equal to 1"):
        RunConfig.model_validate({"stop": {"target_accuracy": 101}})


def test_the_hash_space_and_the_embedding_dim_are_options_like_any_setting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from psctl.settings import OptionError

    data = tmp_path / "clicks.svm"
    data.write_text("1 3:1\n0 4:1\n")
    hashed = ["--dataset", f"libsvm-hashed:{data}"]
    run = configured([*hashed, "--hash-features", "2^24", "--model", "embedding",
                      "--embedding-dim", "4"], tmp_path)
    assert run.data.hash_features == 2**24
    assert run.to_json_dict()["model"]["embedding"] == {"dim": 4}
    assert (run.optimizer.name, run.optimizer.lr) == ("adagrad", 0.005)  # what it implies
    with pytest.raises(typer.BadParameter, match=r"'2\^x' is not a whole number such as 2\^24"):
        configured([*hashed, "--hash-features", "2^x"], tmp_path)
    with pytest.raises(OptionError, match="data set digits is neither"):  # usage: exit 2
        configured(["--hash-features", "2^8"], tmp_path)
    monkeypatch.setenv("PSCTL_DATA__HASH_FEATURES", "2^20")  # not TOML: read as the flag is
    assert configured(hashed, tmp_path).data.hash_features == 2**20
