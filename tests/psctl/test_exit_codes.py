"""Exit codes as docs/cli.md gives them (issue 42): 2 for a bad option or option value, however
it is found bad (by Typer, by the settings' schema, by a policy's rules, by a spec's parser); 1
for an error in a file or the machine; 4 for a run that is not there. In process, refused
before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from psctl import settings
from tests.conftest import psctl_in_process
from tests.psctl.recorded import recorded_run

SMALL = ("--dataset", "digits", "--workers", "1", "--servers", "1", "--epochs", "1",
         "--train-limit", "64", "--no-live", "--no-config")
USAGE, ERROR, NOT_FOUND = settings.EXIT_USAGE, settings.EXIT_ERROR, settings.EXIT_NOT_FOUND

CASES: list[tuple[tuple[str, ...], int, str]] = [
    # psctl launch: bounds, names, specs and combinations of the settings its flags set
    (("launch", *SMALL, "--workers", "0"), USAGE, "cluster.workers"),
    (("launch", *SMALL, "--sync", "bogus"), USAGE, "unknown consistency model 'bogus'"),
    (("launch", *SMALL, "--target-accuracy", "200"), USAGE, "--target-accuracy"),
    (("launch", *SMALL, "--target-accuracy", "0"), USAGE, "--target-accuracy"),
    (("launch", *SMALL, "--target-accuracy", "-5"), USAGE, "--target-accuracy"),
    (("launch", *SMALL, "--target-accuracy", "nan"), USAGE, "--target-accuracy"),
    (("launch", *SMALL, "--target-accuracy", "most"), USAGE, "--target-accuracy"),
    (("launch", *SMALL, "--budget", "5x"), USAGE, "budget '5x'"),
    (("launch", *SMALL, "--budget", "0s"), USAGE, "stop.budget"),
    (("launch", *SMALL, "--dataset", "nope"), USAGE, "unknown data set 'nope'"),
    (("launch", *SMALL, "--model", "nope"), USAGE, "unknown model 'nope'"),
    (("launch", *SMALL, "--optimizer", "nope"), USAGE, "optimizer.name"),
    (("launch", *SMALL, "--lr", "-1"), USAGE, "optimizer.lr"),
    (("launch", *SMALL, "--straggler", "9"), USAGE, "--straggler '9'"),
    (("launch", *SMALL, "--jitter", "cauchy:1"), USAGE, "--jitter"),
    (("launch", *SMALL, "--lr-schedule", "foo"), USAGE, "--lr-schedule 'foo'"),
    (("launch", *SMALL, "--servers", "2", "--key-ranges", "1"), USAGE, "cluster.key_ranges"),
    # a sparse table beside dense layers needs a key range of each kind (engine.keys.partition):
    # given none, a run gets two; one said is refused
    (("launch", *SMALL, "--dataset", "sparse-synthetic:features=2^20,nnz=5", "--model",
      "embedding", "--key-ranges", "1"), USAGE, "it needs at least 2 key ranges"),
    (("launch", *SMALL, "--model", "embedding"), USAGE, "trains sparse data sets"),
    (("launch", *SMALL, "--workers", "x"), USAGE, "--workers"),
    (("launch", *SMALL, "--repeat", "0"), USAGE, "--repeat"),
    # the reading commands
    (("runs", "ls", "--status", "bogus"), USAGE, "unknown run status 'bogus'"),
    (("compare", "--target", "200"), USAGE, "--target"),
    (("compare", "--target", "0"), USAGE, "--target"),
    (("compare", "--json", "--csv"), USAGE, "choose one of"),
    (("compare", "--where", "nope=1"), USAGE, "unknown key 'nope'"),
    (("compare", "--sort-by", "nope"), USAGE, "cannot sort by 'nope'"),
    (("export", "@last", "--format", "xls"), USAGE, "--format"),
    (("runs", "show", "nope"), NOT_FOUND, "nope"),
]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("exit-codes") / "experiments.db"
    recorded_run(path, "c" * 32, "one")
    return path


@pytest.mark.parametrize(("args", "code", "says"), CASES, ids=lambda c: str(c)[:40])
def test_each_refusal_exits_as_documented(args: tuple[str, ...], code: int, says: str,
                                          db: Path, tmp_path: Path) -> None:
    launching = args[0] == "launch"
    fresh = tmp_path / "fresh" / "experiments.db"
    done = psctl_in_process(*args, db=fresh if launching else db)
    assert done.returncode == code, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not fresh.parent.exists()  # refused before the database or any process


def test_a_bad_value_in_a_config_file_is_an_error_not_a_usage_error(tmp_path: Path) -> None:
    config = tmp_path / "settings.toml"
    config.write_text("[train]\nbatch_size = 0\n")
    fresh = tmp_path / "fresh" / "experiments.db"
    for flags in ((), ("--sync", "asp")):  # the file is wrong, with or without a good flag
        done = psctl_in_process("launch", *SMALL, "--config", str(config), *flags, db=fresh)
        assert done.returncode == ERROR, done.stderr
        assert "train.batch_size" in done.stderr
    # A flag that is wrong too: both are named, and the file's error is the one exited with.
    done = psctl_in_process("launch", *SMALL, "--config", str(config), "--workers", "0",
                            db=fresh)
    assert done.returncode == ERROR and "cluster.workers" in done.stderr, done.stderr
    assert not fresh.parent.exists()


def test_a_target_accuracy_in_percent_is_the_fraction(tmp_path: Path) -> None:
    from typer.main import get_command

    from psctl.cli import app
    from psctl.launch_options import launch_config

    launch = get_command(app).commands["launch"]  # type: ignore[attr-defined]
    for given, stored in (("97", 0.97), ("0.97", 0.97), ("99.5", 0.995), ("1", 1.0),
                          ("100", 1.0), ("1.5", 0.015)):
        options = launch.make_context("psctl launch", [*SMALL, "--target-accuracy", given])
        config = launch_config(options.params, tmp_path / "experiments.db")
        assert config.stop.target_accuracy == pytest.approx(stored), given
