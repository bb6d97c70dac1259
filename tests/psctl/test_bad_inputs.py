"""Bad input to every psctl command gives one short error line and exit code 1 or 2 (4 for a run
that is not there, as documented), never a traceback: files that are not UTF-8, database paths
that cannot be used, non-finite or huge numbers, and megabyte-long arguments.

Each case calls psctl's Typer app in this process (tests.conftest.psctl_in_process), with the
exit code, stdout and stderr a user would see; a few run ``python -m psctl`` itself, in the
integration tier (test_bad_inputs_process.py). None starts a run, because every input here must be
refused before anything is launched.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.config import RunConfig
from engine.recorder import Recorder
from engine.wire.records import RunStatus
from tests.conftest import psctl_in_process

pytestmark = pytest.mark.timeout(120)

HUGE = "9" * 20  # past 2**63
LONG = "a" * 100_000
# Flags that make a launch tiny, should one of these cases ever get past validation.
SMALL = ("--dataset", "digits", "--workers", "1", "--servers", "1", "--epochs", "1",
         "--train-limit", "64", "--no-live")
ON_LINUX = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database with one finished run, written by the recorder (no processes launched)."""
    path = tmp_path_factory.mktemp("bad-inputs") / "experiments.db"
    recorder = Recorder(path)
    try:
        recorder.start_run("cd" * 16, "small", RunConfig().to_json_dict(), sync="bsp",
                           workers=1, servers=1, dataset="digits")
        recorder.finish(RunStatus.FINISHED)
    finally:
        recorder.close()
    return path


@pytest.fixture
def fresh_db(tmp_path: Path) -> Path:
    """Where a launch would create its database: a refused launch must leave nothing there."""
    return tmp_path / "fresh" / "experiments.db"


Psctl = Callable[..., subprocess.CompletedProcess[str]]


def refused(*args: str, db: Path, code: int | tuple[int, ...] = (1, 2),
            cwd: Path | None = None, via: Psctl = psctl_in_process) -> str:
    """psctl's one-line error (without the ``error: `` prefix) for a command that must fail."""
    done = run(*args, db=db, cwd=cwd, via=via)
    codes = code if isinstance(code, tuple) else (code,)
    assert done.returncode in codes, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-2000:]
    assert len(lines[0]) < 400, lines[0][:500]
    return lines[0].removeprefix("error: ")


def usage_error(*args: str, db: Path, option: str, via: Psctl = psctl_in_process) -> str:
    """Typer's own usage error (exit 2): a usage line, a hint and a boxed one-line message."""
    done = run(*args, db=db, via=via)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) <= 5, done.stderr
    assert f"Invalid value for '{option}'" in done.stderr, done.stderr
    return done.stderr


def run(*args: str, db: Path, cwd: Path | None = None,
        via: Psctl = psctl_in_process) -> subprocess.CompletedProcess[str]:
    done = via(*args, db=db, cwd=cwd)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


# -- config files and settings -------------------------------------------------------------------


@pytest.fixture
def not_utf8(tmp_path: Path) -> Path:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b"\xff\xfe\x00bad")
    return path


@pytest.mark.parametrize("command", [("config", "show"), ("launch", *SMALL)])
def test_a_config_file_that_is_not_utf8_is_named(command: tuple[str, ...], not_utf8: Path,
                                                 fresh_db: Path) -> None:
    message = refused(*command, "--config", str(not_utf8), "--no-config", db=fresh_db, code=1)
    assert str(not_utf8) in message and "not UTF-8" in message
    assert not fresh_db.parent.exists()


def test_a_project_file_that_is_not_utf8_is_named(tmp_path: Path, fresh_db: Path) -> None:
    (tmp_path / "psctl.toml").write_bytes(b"[train]\nepochs = \xff\n")
    message = refused("config", "show", db=fresh_db, cwd=tmp_path, code=1)
    assert "psctl.toml" in message and "not UTF-8" in message


# (--target-accuracy reads its value itself, as a fraction or a percentage: test_exit_codes.py)
FLOAT_FLAGS = [("--lr", "optimizer.lr"), ("--momentum", "optimizer.momentum"),
               ("--clip-norm", "optimizer.clip_norm"), ("--eval-interval", "eval.interval_s"),
               ("--max-seconds", "stop.max_seconds")]


@pytest.mark.parametrize(("flag", "setting", "value"), [
    *((flag, setting, value) for flag, setting in FLOAT_FLAGS for value in ("inf", "nan")),
    ("--lr", "optimizer.lr", "-inf"),
])
def test_non_finite_float_flags_are_refused_naming_the_setting(
        flag: str, setting: str, value: str, fresh_db: Path) -> None:
    message = refused("launch", *SMALL, flag, value, db=fresh_db, code=2)
    assert message == (f"invalid configuration: {setting}: Input should be a finite number "
                       f"(got {value})")
    assert not fresh_db.parent.exists()


@pytest.mark.parametrize(("flags", "setting"), [
    (("--straggler", f"0:{HUGE}x"), "heterogeneity.stragglers.0.factor"),
    (("--straggler", f"0:2x@{HUGE}s"), "heterogeneity.stragglers.0.onset_s"),
    (("--jitter", f"lognormal:{HUGE}"), "heterogeneity.jitter.sigma"),
    (("--seed", HUGE), "train.seed"),
    (("--seed", "-1"), "train.seed"),
    (("--workers", HUGE), "cluster.workers"),
    (("--max-seconds", "1e300"), "stop.max_seconds"),
])
def test_huge_numbers_are_refused_naming_the_setting(flags: tuple[str, str], setting: str,
                                                     fresh_db: Path) -> None:
    message = refused("launch", *SMALL, *flags, db=fresh_db, code=2)
    assert message.startswith(f"invalid configuration: {setting}: ")


@pytest.mark.parametrize(("flags", "says"), [
    (("--prune", "topk:150%"), "topk:P% (e.g. topk:1%)"),
    (("--prune", "topk:0%"), "topk:P% (e.g. topk:1%)"),
    (("--prune", "sigma:-1"), "sigma:K (e.g. sigma:2)"),
    (("--prune", "sigma:nan"), "sigma:K (e.g. sigma:2)"),
    (("--prune", "magic:3"), "dynamic, none"),
    (("--momentum-correction", "1.5"), "comm.momentum_correction"),
    (("--prune", "topk:1%", "--momentum-correction", "0.9", "--no-error-feedback"),
     "needs comm.error_feedback"),
])
def test_bad_push_filters_are_refused_saying_what_to_write(flags: tuple[str, ...], says: str,
                                                           fresh_db: Path) -> None:
    message = refused("launch", *SMALL, *flags, db=fresh_db, code=2)
    assert message.startswith("invalid configuration: comm") and says in message, message
    assert not fresh_db.parent.exists()


@pytest.mark.parametrize(("toml", "setting"), [
    ("[optimizer]\nlr = nan\n", "optimizer.lr"),
    ("[stop]\nmax_seconds = inf\n", "stop.max_seconds"),
    ("[cluster]\nconnect_timeout_s = 1e300\n", "cluster.connect_timeout_s"),
    ("[[heterogeneity.stragglers]]\nrank = 0\nfactor = inf\n",
     "heterogeneity.stragglers.0.factor"),
])
def test_non_finite_values_in_a_config_file_are_refused(toml: str, setting: str, tmp_path: Path,
                                                        fresh_db: Path) -> None:
    config = tmp_path / "settings.toml"
    config.write_text(toml)
    message = refused("config", "show", "--config", str(config), "--no-config", db=fresh_db,
                      code=1)
    assert message.startswith(f"invalid configuration: {setting}: ")


def test_a_non_finite_environment_setting_is_refused(fresh_db: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PSCTL_EVAL__INTERVAL_S", "inf")
    message = refused("config", "show", "--no-config", db=fresh_db, code=1)
    assert message == "invalid configuration: eval.interval_s: Input should be a finite number " \
        "(got inf)"


# -- database paths ------------------------------------------------------------------------------


def test_launch_into_a_folder_is_refused(tmp_path: Path) -> None:
    message = refused("launch", *SMALL, "--db", str(tmp_path), db=tmp_path / "unused.db", code=1)
    assert str(tmp_path) in message and "folder" in message


def test_launch_under_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("not a folder")
    path = tmp_path / "plain" / "experiments.db"
    message = refused("launch", *SMALL, "--db", str(path), db=path, code=1)
    assert str(path) in message and "cannot create" in message


@ON_LINUX
@pytest.mark.parametrize("path", ["/proc/psctl.db", "/proc/no-such-folder/psctl.db"])
def test_launch_into_an_impossible_path_is_refused(path: str) -> None:
    message = refused("launch", *SMALL, "--db", path, db=Path(path), code=1)
    assert path in message


def test_launch_into_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("x" * 4096)
    message = refused("launch", *SMALL, "--db", str(path), db=path, code=1)
    assert str(path) in message and "not a database" in message


def test_a_database_that_is_not_there_is_named(tmp_path: Path) -> None:
    impossible = [Path("/proc/psctl.db")] if Path("/proc/self").is_dir() else []
    for path in (tmp_path, tmp_path / "no-such-folder" / "x.db", *impossible):
        message = refused("runs", "ls", "--db", str(path), db=path, code=1)
        assert f"no experiments database at {path}" in message


@pytest.mark.parametrize("command", [("runs", "show", "@last"), ("compare",), ("export", "@last"),
                                     ("runs", "tag", "@last", "k=v"),
                                     ("zipline", "replay", "@last")])
def test_every_reader_names_a_database_that_is_not_there(command: tuple[str, ...],
                                                         tmp_path: Path) -> None:
    path = tmp_path / "no-such-folder" / "x.db"
    message = refused(*command, "--db", str(path), db=path, code=1)
    assert f"no experiments database at {path}" in message


def test_readers_of_a_file_that_is_not_a_database_say_so(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("x" * 4096)
    message = refused("runs", "ls", "--db", str(path), db=path, code=1)
    assert "not a database" in message


# -- numbers and run selectors of the reading commands -------------------------------------------


@pytest.mark.parametrize("value", [HUGE, "-1", f"-{HUGE}"])
def test_runs_ls_limit_is_bounded(value: str, db: Path) -> None:
    usage_error("runs", "ls", "--limit", value, db=db, option="--limit")


def test_runs_ls_limit_at_the_bound_lists_every_run(db: Path) -> None:
    done = run("runs", "ls", "--limit", str(2**63 - 1), "--json", db=db)
    assert done.returncode == 0 and '"small"' in done.stdout


@pytest.mark.parametrize(("command", "selector"), [
    *((("runs", "show"), selector)
      for selector in (f"@last~{HUGE}", f"@last~{'9' * 5000}", LONG, "[/x]", "ab" * 40)),
    *((command, LONG) for command in (("export",), ("compare",), ("zipline", "replay"))),
])
def test_selectors_that_match_nothing_are_quoted_briefly(command: tuple[str, ...],
                                                         selector: str, db: Path) -> None:
    message = refused(*command, selector, db=db, code=4)
    assert message.startswith("no run matches '")
    assert len(message) < 200


def test_a_long_where_key_is_quoted_briefly(db: Path) -> None:
    message = refused("compare", "--where", f"{LONG}=1", db=db, code=2)
    assert message.startswith("unknown key 'aaaa") and "…'" in message


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "100.5", "x"])
def test_compare_target_must_be_an_accuracy(value: str, db: Path) -> None:
    usage_error("compare", "--target", value, db=db, option="--target")


def test_zipline_lookahead_is_bounded(db: Path) -> None:
    usage_error("zipline", "replay", "@last", "--lookahead", HUGE, db=db, option="--lookahead")


def test_zipline_predictor_is_quoted_as_typed(db: Path) -> None:
    message = refused("zipline", "replay", "@last", "--predictor", "[/x]", db=db, code=2)
    assert message == "unknown predictor '[/x]' (known: last, ewma)"


# -- output paths and addresses ------------------------------------------------------------------


def test_export_under_a_file_is_refused(db: Path, tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("not a folder")
    out = tmp_path / "plain" / "export"
    message = refused("export", "@last", "--out", str(out), db=db, code=1)
    assert message.startswith(f"cannot create {out}")


def test_ui_port_is_bounded(db: Path) -> None:
    usage_error("ui", "--port", HUGE, db=db, option="--port")


def test_ui_on_an_address_of_another_machine_is_refused(db: Path) -> None:
    # 192.0.2.1 is reserved for documentation (RFC 5737): never this machine's, no DNS needed.
    message = refused("ui", "--host", "192.0.2.1", "--port", "0", db=db, code=1)
    assert message.startswith("cannot serve the dashboard on 192.0.2.1:0: ")


def test_ui_on_a_port_in_use_is_refused(db: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = refused("ui", "--port", str(port), db=db, code=1)
    assert message.startswith(f"cannot serve the dashboard on 127.0.0.1:{port}: ")


@pytest.mark.parametrize(("flags", "says"), [
    (("--servers", "2", "--key-ranges", "1"), "cluster.key_ranges 1 must be between the 2 servers"),
    (("--servers", "1", "--key-ranges", "65"), "and 64 per server (64)"),
    (("--servers", "1", "--key-ranges", "2", "--backend", "sim"),
     "does not model cluster.key_ranges"),
])
def test_key_ranges_out_of_bounds_are_refused_before_anything_starts(
        flags: tuple[str, ...], says: str, fresh_db: Path) -> None:
    message = refused("launch", *SMALL, *flags, db=fresh_db, code=2)  # the last --servers wins
    assert message.startswith("invalid configuration: cluster") and says in message, message
    assert not fresh_db.parent.exists()


def test_scale_without_a_count_says_what_to_give(db: Path) -> None:
    message = refused("scale", "small", db=db, code=2)
    assert message == "say how many --workers or --servers the job should have"


def test_scale_servers_of_a_run_that_is_not_running_is_refused(db: Path) -> None:
    message = refused("scale", "small", "--servers", "3", db=db, code=1)
    assert "is not running; only a running job can change its servers" in message
