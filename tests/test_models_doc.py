"""docs/models.md: its tables state what the code builds, and its commands run as written, from
the repository's root, with the output the page shows."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.config import ModelConfig, TrainConfig
from engine.datasets import get_spec
from engine.models.kinds import MODELS
from engine.models.spec import builtin_layout
from tests.conftest import REPO

DOC = (REPO / "docs" / "models.md").read_text()
BASH = re.findall(r"```bash\n(.*?)```", DOC, flags=re.S)
TEXT = re.findall(r"```text\n(.*?)```", DOC, flags=re.S)


def _row(first_cell: str) -> list[str]:
    match = re.search(rf"^\| {re.escape(first_cell)} \|(.*)\|$", DOC, flags=re.M)
    assert match is not None, f"no row {first_cell!r}"
    return [cell.strip() for cell in match.group(1).split("|")]


def test_the_model_table_states_the_key_counts() -> None:
    mnist = get_spec("mnist")
    assert ModelConfig().name == "mlp" and TrainConfig().device == "auto"
    for model in MODELS.names():
        cell = _row(f"`{model}` (default)" if model == "mlp" else f"`{model}`")[-1]
        if MODELS.get(model).layout is None:  # no dense samples: no MNIST key count
            assert cell == "sparse data sets only"
            continue
        layout = builtin_layout(ModelConfig(name=model), mnist.sample_shape, 10)
        assert layout is not None
        assert cell == f"{layout.num_keys:,}"


def test_the_examples_named_exist() -> None:
    for example in re.findall(r"docs/examples/\w+\.py", DOC):
        assert (REPO / example).is_file(), example


def test_the_sparse_command_is_the_one_the_benchmark_measured() -> None:
    from bench.workloads import sparse_command

    measured = sparse_command("x", kkt=True)
    shown = TEXT[0].split()
    assert shown[0] == "psctl" and shown[1:] == measured[:measured.index("--name")]


def test_the_logged_metrics_example_is_the_one_shown_and_its_commands_are_run() -> None:
    """The section's commands are what tests/integration/test_user_metrics.py runs, and the
    code it shows is the example file's own."""
    from tests.integration.test_user_metrics import doc_commands

    assert doc_commands() == BASH[2] and "--model docs/examples/logged_metrics.py" in BASH[2]
    source = (REPO / "docs" / "examples" / "logged_metrics.py").read_text()
    [shown] = re.findall(r"```python\n# docs/examples/logged_metrics.py\n(.*?)```", DOC,
                         flags=re.S)
    for line in shown.splitlines():
        assert line.strip() == "..." or line in source, line


def test_the_billion_key_commands_are_the_ones_the_benchmark_measured() -> None:
    """A minute each: bench/sparse_scale.py runs them (its part 2), and its results back what
    the section says; they must be the same commands."""
    from bench.sparse_scale import RUNS

    shown = [line.split() for line in TEXT[1].strip().splitlines()]
    measured = [["psctl", "launch", *RUNS[name], "--workers", "4", "--servers", "4"]
                for name in ("1e9 features", "2^40 features, Zipf 1.1, Adagrad")]
    assert [sorted(c) for c in shown] == [sorted(c) for c in measured]
    assert [c[:2] for c in shown] == [["psctl", "launch"]] * 2


def test_the_hashed_space_is_written_as_the_page_says(tmp_path: Path) -> None:
    from engine.datasets.hashed import FEATURES
    from engine.plan import build_config

    data = tmp_path / "clicks.svm"
    data.write_text("1 3:1\n0 4:1\n")
    spellings = ("16777216", "16_777_216", "2^24")
    assert f"written `{spellings[0]}`, `{spellings[1]}` or `{spellings[2]}`" in DOC
    for spelling in spellings:
        config = build_config({}, {"data.dataset": f"libsvm-hashed:{data}",
                                   "data.hash_features": spelling})
        assert config.data.hash_features == 2**24
    assert "*n* is 2^30 unless `--hash-features N`" in DOC and FEATURES == 2**30


def test_the_embedding_commands_compose_the_run_the_page_describes(tmp_path: Path) -> None:
    """The acceptance command, with its optimizer said and without it (what the model implies),
    and the dim's setting; composed, not run (bench/sparse_scale.py runs it)."""
    import typer.main

    from engine.models.kinds import EmbeddingSettings
    from psctl.cli import app
    from psctl.launch_options import launch_config

    launch = typer.main.get_command(app).commands["launch"]  # type: ignore[attr-defined]
    [command] = re.findall(r"`(psctl launch --model embedding [^`]*)`", DOC)
    said = command.split()[2:]
    assert said[said.index("--optimizer"):][:4] == ["--optimizer", "adagrad", "--lr", "0.005"]
    implied = [word for word in said if word not in ("--optimizer", "adagrad", "--lr", "0.005")]

    def composed(args: list[str]) -> dict[str, Any]:
        options = launch.make_context("psctl launch", [*args, "--no-config"])
        return launch_config(options.params, tmp_path / "experiments.db").to_json_dict()

    run = composed(said)
    assert composed(implied) == run  # Adagrad at 0.005 is what --model embedding implies
    assert (run["optimizer"]["name"], run["optimizer"]["lr"]) == ("adagrad", 0.005)
    dim = EmbeddingSettings.model_fields["dim"]
    assert "`--embedding-dim N` (1 to 256, 8 by default)" in DOC and dim.default == 8
    assert composed([*implied, "--embedding-dim", "4"])["model"] == {
        "name": "embedding", "hidden": [512, 512, 512], "embedding": {"dim": 4}}


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_the_commands_run_and_say_what_the_page_says(tmp_path: Path) -> None:
    assert len(BASH) == 3 and len(TEXT) == 3  # the third is test_user_metrics.py's
    env = {**os.environ, "PSCTL_DB": str(tmp_path / "experiments.db"), "NO_COLOR": "1",
           "COLUMNS": "400", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    runs = subprocess.run(["bash", "-ec", BASH[0]], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=360, check=False)
    assert runs.returncode == 0, runs.stdout[-3000:] + runs.stderr[-3000:]
    claimed = re.findall(r"(\d+\.\d+) %", DOC.split("Each ends with")[1].split("\n\n")[0])
    got = re.findall(r"best test accuracy (\d+\.\d+)%", runs.stdout + runs.stderr)
    assert len(got) == 2 == len(claimed)
    for mine, theirs in zip(got, claimed, strict=True):  # the runs are seeded; threads may vary
        assert abs(float(mine) - float(theirs)) <= 2.0, (got, claimed)
    stored = dict(sqlite3.connect(tmp_path / "experiments.db").execute(
        "SELECT dataset, config_json FROM runs").fetchall())
    assert set(stored) == {"digits", "blobs"}  # a user's data set is named by its file's stem
    user_model = json.loads(stored["digits"])["model"]["name"]
    assert user_model == f"{REPO / 'docs' / 'examples' / 'small_cnn.py'}:build"  # made absolute
    assert json.loads(stored["blobs"])["data"]["dataset"] == \
        f"{REPO / 'docs' / 'examples' / 'blobs.py'}:load"
    gpu = subprocess.run(["bash", "-c", BASH[1]], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    said = gpu.stdout + gpu.stderr
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the error the page shows cannot happen")
    for line in TEXT[2].strip().splitlines():
        assert line in said, said
    assert "psctl run" not in said  # nothing was started


def test_the_bound_on_metric_names_is_the_one_schema_md_states() -> None:
    """Issue 57: this page said a 33rd name raises, docs/schema.md that its values are dropped.
    Both hold, each for its own case (a process, a run), and both pages say both, with the
    code's number."""
    from engine.usermetrics import MAX_NAMES

    schema = " ".join((REPO / "docs" / "schema.md").read_text().split())
    here = " ".join(DOC.split())
    assert f"at most **{MAX_NAMES} names** in a process. Anything else raises" in here
    assert f"A run records {MAX_NAMES} names too" in here
    assert "the name said once in a `user_metrics_dropped` event" in here
    assert f"A process's code logs at most {MAX_NAMES} names (a 33rd raises `MetricError`" in schema
    assert f"the coordinator keeps a run to {MAX_NAMES} names" in schema
    assert "said once in a `user_metrics_dropped` event" in schema
