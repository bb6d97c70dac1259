"""One builder for every process: built-in models match their torch-free layouts, a user's
model file is loaded and checked, and batch-norm statistics are re-estimated for evaluation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from engine.config import ModelConfig
from engine.errors import ConfigError
from engine.models.build import build_module, layout_of
from engine.models.flat import FlatModel, calibration_sample, evaluate, refresh_buffers, train_step
from engine.models.spec import CNNSpec, builtin_layout, check_model
from tests.conftest import REPO

EXAMPLE = REPO / "docs" / "examples" / "small_cnn.py"


@pytest.mark.parametrize(("model", "shape"), [
    ("cnn", (1, 28, 28)), ("cnn", (3, 32, 32)), ("cnn", (16, 16)), ("mlp", (1, 8, 8)),
    ("logreg", (1, 28, 28)), ("logreg", (20,)),
])
def test_builtin_layouts_match_the_modules_they_build(model: str,
                                                       shape: tuple[int, ...]) -> None:
    module = build_module(model, (32, 16), shape, 7, seed=0)
    config = ModelConfig(name=model, hidden=(32, 16))
    assert builtin_layout(config, shape, 7) == layout_of(module)
    assert module(torch.zeros(3, *shape)).shape == (3, 7)


def test_the_mnist_cnn_is_lenet_with_431080_keys() -> None:
    layout = builtin_layout(ModelConfig(name="cnn", hidden=()), (1, 28, 28), 10)
    assert layout is not None and layout.num_keys == 431_080
    assert [s.name for s in layout.segments][::2] == [
        "features.0.weight", "features.3.weight", "classifier.0.weight", "classifier.3.weight"]


@pytest.mark.parametrize(("shape", "says"), [((1, 8, 8), "at least 16x16"),
                                             ((64,), "takes images")])
def test_the_cnn_refuses_samples_it_cannot_take(shape: tuple[int, ...], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        CNNSpec(shape, 10)


def test_same_seed_same_values_in_every_process() -> None:
    first = FlatModel.of(build_module("cnn", (), (1, 28, 28), 10, seed=3))
    again = FlatModel.of(build_module("cnn", (), (1, 28, 28), 10, seed=3))
    other = FlatModel.of(build_module("cnn", (), (1, 28, 28), 10, seed=4))
    np.testing.assert_array_equal(first.params_np, again.params_np)
    assert not np.array_equal(first.params_np, other.params_np)


def test_a_cnn_step_fills_the_flat_gradient_and_values_are_live() -> None:
    model = FlatModel.of(build_module("cnn", (), (1, 28, 28), 10, seed=0))
    inputs, targets = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    train_step(model, inputs, targets)
    assert np.count_nonzero(model.grads_np) > 0.5 * model.num_keys
    model.params_np[:] = 0.0  # a pull writes here; the module computes with it at once
    with torch.no_grad():
        assert float(model.module(inputs).abs().sum()) == 0.0


def test_the_example_model_file_builds_and_trains() -> None:
    name = check_model(f"{EXAMPLE}:build")
    assert name == f"{EXAMPLE.resolve()}:build"
    module = build_module(name, (), (1, 8, 8), 10, seed=0)
    model = FlatModel.of(module)
    names = [s.name for s in model.layout.segments]
    assert names[:4] == ["1.weight", "1.bias", "2.weight", "2.bias"]  # batch norm's affine
    assert not any("running" in n for n in names)  # buffers are never keys
    assert train_step(model, torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))) > 0


def _write(tmp_path: Path, body: str) -> str:
    path = tmp_path / "mymodel.py"
    path.write_text("from torch import nn\nimport torch\n" + body)
    return str(path)


@pytest.mark.parametrize(("body", "says"), [
    ("def build(shape, classes):\n    raise ValueError('too small')\n",
     r"build\(\(1, 8, 8\), 10\) raised ValueError: too small"),
    ("def build(shape, classes):\n    return 42\n", "returned int, not a torch.nn.Module"),
    ("def build(shape, classes):\n    return nn.Linear(64, classes).double()\n",
     "must be float32"),
    ("def build(shape, classes):\n    return nn.ReLU()\n", "no trainable parameters"),
    ("import no_such_module_here\ndef build(shape, classes):\n    pass\n",
     "importing .* raised ModuleNotFoundError"),
])
def test_a_broken_model_file_says_what_is_wrong(tmp_path: Path, body: str, says: str) -> None:
    name = check_model(_write(tmp_path, body) + ":build")
    with pytest.raises(ConfigError, match=says):
        layout_of(build_module(name, (), (1, 8, 8), 10, seed=0))


@pytest.mark.parametrize(("suffix", "body", "says"), [
    (":make", "def build(shape, classes):\n    pass\n",
     "defines no top-level function 'make' .*build"),
    (":build", "def build(shape, classes)\n    pass\n", "is not valid Python"),
    (":2x", "def build(shape, classes):\n    pass\n", "not a Python function name"),
])
def test_the_cli_check_reads_the_file_without_running_it(tmp_path: Path, suffix: str, body: str,
                                                         says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        check_model(_write(tmp_path, body) + suffix)


def test_unknown_models_and_missing_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown model 'resnet'.*mlp, cnn, logreg"):
        check_model("resnet")
    with pytest.raises(ConfigError, match="cannot read"):
        check_model(str(tmp_path / "absent.py"))
    assert check_model(" CNN ") == "cnn"


def test_the_evaluator_re_estimates_batch_norm_statistics() -> None:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    model = FlatModel.of(module)
    inputs = torch.randn(4096, 4) * 5 + 2
    sample = calibration_sample(model, inputs.numpy(), seed=0)
    assert sample is not None and len(sample) == 2048
    assert refresh_buffers(model.module, sample)
    norm = module[1]
    with torch.no_grad():
        hidden = module[0](sample)
    assert isinstance(norm, nn.BatchNorm1d) and norm.running_mean is not None
    torch.testing.assert_close(norm.running_mean, hidden.mean(0), rtol=1e-4, atol=1e-4)
    assert norm.momentum == 0.1 and module.training  # restored
    plain = FlatModel.of(nn.Linear(4, 2))
    assert calibration_sample(plain, inputs.numpy(), seed=0) is None
    assert not refresh_buffers(plain.module, inputs)


def test_evaluate_runs_in_eval_mode_and_restores_the_mode() -> None:
    module = build_module("cnn", (), (1, 28, 28), 10, seed=0)
    inputs, targets = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    first = evaluate(module, inputs, targets)
    assert evaluate(module, inputs, targets) == first  # dropout off: deterministic
    assert module.training
