"""Study files (psctl/study.py): what a good one expands to, and a clear error, naming the file
and the key, for each kind of mistake. Nothing here starts a run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.errors import ConfigError, DatasetNotFound
from psctl.cli import app
from psctl.study import MAX_RUNS, grid, load_study, point_configs, slug

GOOD = """
[study]
name = "sync-stragglers"
title = "Sync models under a 3x straggler"
seed_doc = "001"
target = 0.97

[base]
cluster.servers = 2
data.dataset = "digits"
heterogeneity.stragglers = [{rank = 0, factor = 3.0}]

[[axis]]
name = "sync"
  [[axis.values]]
  label = "BSP"
  set = { "sync.model" = "bsp" }
  [[axis.values]]
  label = "SSP s=3"
  set = { sync.model = "ssp", sync.staleness = 3 }
  [[axis.values]]
  label = "ElasticBSP R=60"
  set = { "sync.model" = "elastic", "sync.lookahead" = 60 }

[[axis]]
name = "workers"
key = "cluster.workers"
values = [4, 16, 64]

[smoke]
set = { "train.epochs" = 1, "data.train_limit" = 2000 }
axes = { workers = [4], sync = ["BSP", "ElasticBSP R=60"] }
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(text)
    return path


def test_a_good_file_expands_to_the_cross_product_first_axis_slowest(tmp_path: Path) -> None:
    study = load_study(write(tmp_path, GOOD))
    points = grid(study)
    assert [p.name for p in points][:4] == [
        "sync-stragglers-bsp-4", "sync-stragglers-bsp-16", "sync-stragglers-bsp-64",
        "sync-stragglers-ssp-s-3-4"]
    assert len(points) == 9
    ssp16 = points[4]
    assert ssp16.labels == (("sync", "SSP s=3"), ("workers", "16"))
    assert ssp16.overrides == {"sync.model": "ssp", "sync.staleness": 3, "cluster.workers": 16}
    (config,) = point_configs(study, ssp16)
    assert (config.name, config.sync.model, config.sync.staleness) == (ssp16.name, "ssp", 3)
    assert config.cluster.workers == 16 and config.cluster.servers == 2
    assert config.heterogeneity.stragglers[0].factor == 3.0


def test_smoke_keeps_the_chosen_values_and_applies_its_settings(tmp_path: Path) -> None:
    study = load_study(write(tmp_path, GOOD))
    points = grid(study, smoke=True)
    assert [p.name for p in points] == ["sync-stragglers-bsp-4",
                                        "sync-stragglers-elasticbsp-r-60-4"]
    config = point_configs(study, points[1])[0]
    assert (config.train.epochs, config.data.train_limit, config.sync.lookahead) == (1, 2000, 60)


def test_repeat_gives_each_point_consecutive_seeds(tmp_path: Path) -> None:
    text = GOOD.replace('target = 0.97', 'target = 0.97\nrepeat = 3')
    study = load_study(write(tmp_path, text.replace("[base]", "[base]\ntrain.seed = 7")))
    configs = point_configs(study, grid(study)[0])
    assert [(c.train.seed, c.name) for c in configs] == [
        (7, "sync-stragglers-bsp-4-seed7"), (8, "sync-stragglers-bsp-4-seed8"),
        (9, "sync-stragglers-bsp-4-seed9")]


def test_slug_makes_labels_fit_run_names() -> None:
    assert slug("ElasticBSP R=240") == "elasticbsp-r-240"
    assert slug("lr 0.1") == "lr-0.1"
    assert slug("!!") == "x"


BAD = [
    # (what to change in GOOD, old -> new), words the message must hold
    (("[study]\n", "[studie]\n"), ["studie", "unknown key"]),
    (('name = "sync-stragglers"', 'name = "Sync_Stragglers"'), ["[study] name", "pattern"]),
    (("target = 0.97", "target = 97"), ["[study] target", "less than or equal to 1"]),
    (("target = 0.97", "targt = 0.97"), ["[study] target: missing", "targt: unknown key"]),
    (("cluster.servers = 2", "cluster.srvers = 2"), ["[base]", "cluster.srvers"]),
    (("cluster.servers = 2", 'name = "mine"'), ["[base] name", "remove it"]),
    (('name = "workers"', 'nam = "workers"'), ["[[axis]] #2", "name: missing"]),
    (('name = "workers"', 'name = "sync"'), ["[[axis]] sync", "two axes share"]),
    (('name = "workers"', 'name = "study"'), ["[[axis]] study", "choose another"]),
    (('key = "cluster.workers"\n', ""), ["[[axis]] workers values[0]", "plain value"]),
    (('label = "BSP"', 'label = "ssp-s-3"'), ["[[axis]] sync", "'ssp-s-3'", "label"]),
    (('label = "BSP"', 'lable = "BSP"'), ["[[axis]] sync values[0].label: missing"]),
    (('"sync.lookahead" = 60', '"sync.lookahed" = 60'), ["[[axis]] sync", "sync.lookahed"]),
    (('key = "cluster.workers"', 'key = "sync.staleness"'),
     ["[[axis]] workers", "sync.staleness", "axis sync sets too"]),
    (("axes = { workers = [4]", "axes = { worker = [4]"), ["[smoke] axes.worker", "no axis"]),
    (("axes = { workers = [4]", "axes = { workers = [8]"), ["[smoke] axes.workers", "'8'"]),
    (('"train.epochs" = 1', '"train.epoch" = 1'), ["[smoke] set", "train.epoch"]),
    (("values = [4, 16, 64]", "values = []"), ["[[axis]] workers values", "at least 1"]),
]


@pytest.mark.parametrize(("change", "words"), BAD, ids=[w[0] for _, w in BAD])
def test_each_mistake_is_a_config_error_naming_file_and_key(
        tmp_path: Path, change: tuple[str, str], words: list[str]) -> None:
    old, new = change
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(ConfigError) as raised:
        load_study(path)
    message = str(raised.value)
    assert message.startswith(str(path)), message
    for word in words:
        assert word in message, message


def test_a_point_that_cannot_run_fails_before_any_run_naming_it(tmp_path: Path) -> None:
    # Worker 4 does not exist in a 4-worker run: only that point is wrong.
    text = GOOD.replace("rank = 0", "rank = 4")
    path = write(tmp_path, text)
    done = CliRunner().invoke(app, ["study", str(path), "--dry-run"])
    assert done.exit_code == 1
    assert "grid point sync=BSP, workers=4" in done.stderr
    assert "straggler ranks [4] must be below cluster.workers (4)" in done.stderr


def test_unreadable_toml_and_missing_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_study(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="cannot read"):
        load_study(write(tmp_path, "[study\n"))


def test_dry_run_lists_the_grid_without_running(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    done = CliRunner().invoke(app, ["study", str(write(tmp_path, GOOD)), "--list", "--smoke",
                                    "--db", str(db)])
    assert done.exit_code == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "sync-stragglers: 2 points"
    assert "sync-stragglers-elasticbsp-r-60-4  [sync=ElasticBSP R=60, workers=4]" in lines[2]
    assert "sync.lookahead=60 cluster.workers=4 train.epochs=1 data.train_limit=2000" in lines[2]
    assert not db.exists()


def test_smoke_without_a_smoke_table_warns_and_keeps_the_grid(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.partition("[smoke]")[0])
    done = CliRunner().invoke(app, ["study", str(path), "--dry-run", "--smoke"])
    assert done.exit_code == 0, done.stderr
    assert "has no [smoke] table; --smoke runs the whole grid" in done.stderr
    assert done.stdout.startswith("sync-stragglers: 9 points\n")


def test_a_grid_above_the_limit_is_refused_in_one_line_before_any_point(tmp_path: Path) -> None:
    values = ", ".join(str(v) for v in range(1, 101))
    axes = "".join(f'\n[[axis]]\nname = "a{n}"\nkey = "train.epochs"\nvalues = [{values}]\n'
                   for n in range(3))
    # 100 x 100 x 100 = 10^6 points: counted, never made (listing them took 105 s).
    text = GOOD.partition("[[axis]]")[0] + axes
    path = write(tmp_path, text)
    db = tmp_path / "experiments.db"
    started = time.monotonic()
    done = CliRunner().invoke(app, ["study", str(path), "--dry-run", "--db", str(db)])
    assert done.exit_code == 1
    (line,) = done.stderr.strip().splitlines()
    assert str(path) in line and "1,000,000 runs (100 x 100 x 100 values)" in line
    assert f"at most {MAX_RUNS:,}" in line
    assert done.stdout == "" and not db.exists()
    assert time.monotonic() - started < 30  # a bound against listing the grid, not a benchmark


def test_repeat_counts_toward_the_limit(tmp_path: Path) -> None:
    values = ", ".join(str(v) for v in range(1, 11))
    text = (GOOD.partition("[[axis]]")[0].replace("target = 0.97", "target = 0.97\nrepeat = 100")
            + f'[[axis]]\nname = "e"\nkey = "train.epochs"\nvalues = [{values}]\n')
    assert load_study(write(tmp_path, text)).spec.study.repeat == 100  # 1,000 runs: allowed
    with pytest.raises(ConfigError, match=r"1,100 runs \(11 values x 100 seeds\)"):
        load_study(write(tmp_path, text.replace("values = [1,", "values = [0.5, 1,")))


def test_data_dir_reaches_the_data_set_loader_over_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.datasets

    asked: list[tuple[str, Path | None]] = []

    def locate(name: str, data_dir: Path | None = None, *, allow_download: bool = False) -> str:
        asked.append((name, data_dir))
        raise DatasetNotFound(f"data set {name!r} not found in {data_dir}")

    monkeypatch.setattr(engine.datasets, "locate", locate)
    monkeypatch.setenv("PSCTL_DATA_DIR", str(tmp_path / "elsewhere"))
    path = write(tmp_path, GOOD.replace('data.dataset = "digits"', 'data.dataset = "mnist"'))
    db = tmp_path / "experiments.db"
    done = CliRunner().invoke(app, ["study", str(path), "--smoke", "--db", str(db),
                                    "--data-dir", "../shared/data"])
    assert done.exit_code == 1
    assert asked == [("mnist", Path("../shared/data"))]
    (line,) = done.stderr.strip().splitlines()
    assert "not found in ../shared/data" in line
    assert not db.exists()  # located before the database is made or any run starts


def test_plan_pins_the_folder_given_by_data_dir(tmp_path: Path, mnist_dir: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from psctl.study_run import plan

    monkeypatch.delenv("PSCTL_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./data or ../shared to find by accident
    study = load_study(write(tmp_path, GOOD.replace('data.dataset = "digits"',
                                                    'data.dataset = "mnist"')))
    planned = plan(study, grid(study, smoke=True), data_dir=mnist_dir.parent)
    assert {p.config.data.data_dir for p in planned} == {str(mnist_dir.resolve())}


def test_the_documented_limit_is_the_one_in_force() -> None:
    from tests.conftest import REPO

    doc = " ".join((REPO / "docs" / "studies.md").read_text().split())
    assert f"A study has at most {MAX_RUNS:,} runs" in doc


def test_repeated_points_whose_group_tag_would_be_too_long_are_refused(tmp_path: Path) -> None:
    label = "x" * 60
    keys = ["train.epochs", "train.batch_size", "optimizer.lr", "optimizer.momentum"]
    axes = "".join(f'\n[[axis]]\nname = "a{n}"\n  [[axis.values]]\n  label = "{label}"\n'
                   f'  set = {{ "{key}" = 0.5 }}\n' for n, key in enumerate(keys))
    text = GOOD.partition("[[axis]]")[0].replace("target = 0.97", "target = 0.97\nrepeat = 2")
    with pytest.raises(ConfigError, match=r"run names reach 259 characters; with repeat they "
                                          r"are group tags \(name-study id\) of at most 256"):
        load_study(write(tmp_path, text + axes))
    # 15 + 4 x 61 = 259 characters; 12 fewer and the group tag is exactly 256
    assert load_study(write(tmp_path, text + axes.replace("x" * 60, "x" * 48, 1)))


def test_smoke_repeat_replaces_the_studys_repeat(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(GOOD.replace("target = 0.97", "target = 0.97\nrepeat = 3").replace(
        "[smoke]", "[smoke]\nrepeat = 2"))
    study = load_study(path)
    (point, *_) = grid(study.smoked(), smoke=True)
    assert len(point_configs(study.smoked(), point)) == 2
    assert len(point_configs(study, point)) == 3
