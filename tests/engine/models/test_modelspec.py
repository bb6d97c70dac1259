"""The torch-free model layout agrees with the torch model, and the flat buffers are live views."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from engine.errors import ConfigError
from engine.keys import KeyLayout, KeyRange
from engine.models.flat import MLP, FlatModel, evaluate, train_step
from engine.models.spec import MLPSpec, Segment

MNIST_SPEC = MLPSpec(784, (512, 512, 512), 10)
SMALL = MLPSpec(6, (5, 4), 3)


def test_mnist_mlp_has_932362_keys() -> None:
    assert MNIST_SPEC.num_keys == 932362
    assert MNIST_SPEC.widths == (784, 512, 512, 512, 10)


def test_segments_of_a_small_spec() -> None:
    assert SMALL.segments() == [
        Segment("layers.0.weight", (5, 6), KeyRange(0, 30)),
        Segment("layers.0.bias", (5,), KeyRange(30, 35)),
        Segment("layers.1.weight", (4, 5), KeyRange(35, 55)),
        Segment("layers.1.bias", (4,), KeyRange(55, 59)),
        Segment("layers.2.weight", (3, 4), KeyRange(59, 71)),
        Segment("layers.2.bias", (3,), KeyRange(71, 74)),
    ]
    assert SMALL.num_keys == 74


def test_no_hidden_layer_is_a_linear_model() -> None:
    spec = MLPSpec(64, (), 10)
    assert [s.name for s in spec.segments()] == ["layers.0.weight", "layers.0.bias"]
    assert spec.num_keys == 650


@pytest.mark.parametrize("spec", [MNIST_SPEC, SMALL, MLPSpec(64, (), 10), MLPSpec(3, (7,), 2)])
def test_segments_match_torch_named_parameters(spec: MLPSpec) -> None:
    module = MLP(spec)
    named = [(name, tuple(p.shape), p.numel()) for name, p in module.named_parameters()]
    segments = spec.segments()
    assert [(s.name, s.shape, len(s.keys)) for s in segments] == named
    offset = 0
    for segment in segments:
        assert segment.keys.start == offset
        offset = segment.keys.end
    assert spec.num_keys == offset == sum(p.numel() for p in module.parameters())


# -- FlatModel ----------------------------------------------------------------------------------


def test_flat_model_starts_from_the_seeded_torch_initialisation() -> None:
    flat = FlatModel(SMALL, seed=3)
    torch.manual_seed(3)
    reference = MLP(SMALL)
    expected = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
    np.testing.assert_array_equal(flat.params_np, expected.numpy())
    assert flat.params_np.dtype == np.float32 and flat.params_np.shape == (74,)
    assert not np.any(flat.params_np == 0.0)  # every weight and bias was copied in
    other = FlatModel(SMALL, seed=4)
    assert not np.array_equal(other.params_np, flat.params_np)


def test_parameters_are_views_of_the_flat_buffer() -> None:
    flat = FlatModel(SMALL, seed=0)
    base = flat.params.data_ptr()
    for segment, (name, parameter) in zip(
        SMALL.segments(), flat.module.named_parameters(), strict=True
    ):
        assert name == segment.name
        assert parameter.data_ptr() == base + 4 * segment.keys.start
        assert parameter.grad is not None
        assert parameter.grad.data_ptr() == flat.grads.data_ptr() + 4 * segment.keys.start


def test_writing_the_flat_buffer_changes_the_module_output() -> None:
    flat = FlatModel(SMALL, seed=0)
    inputs = torch.randn(4, 6)
    flat.params_np[:] = 0.0
    last_bias = SMALL.segments()[-1].keys
    flat.params_np[last_bias.start : last_bias.end] = [1.0, -2.0, 3.5]
    with torch.no_grad():
        out = flat.module(inputs)
    np.testing.assert_array_equal(out.numpy(), np.tile([1.0, -2.0, 3.5], (4, 1)))


def test_module_output_follows_a_full_copy_into_the_buffer() -> None:
    flat, donor = FlatModel(SMALL, seed=0), FlatModel(SMALL, seed=1)
    inputs = torch.randn(8, 6)
    with torch.no_grad():
        expected = donor.module(inputs)
        np.copyto(flat.params_np, donor.params_np)
        got = flat.module(inputs)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def reference_grads(flat: FlatModel, inputs: torch.Tensor, targets: torch.Tensor) -> np.ndarray:
    module = copy.deepcopy(flat.module)  # its own storage, the same values
    for parameter in module.parameters():
        parameter.grad = None
    nn.functional.cross_entropy(module(inputs), targets).backward()
    return torch.cat([p.grad.reshape(-1) for p in module.parameters()]).numpy()  # type: ignore[union-attr]


def test_train_step_fills_the_flat_gradient() -> None:
    flat = FlatModel(SMALL, seed=0)
    inputs, targets = torch.randn(16, 6), torch.randint(0, 3, (16,))
    loss = train_step(flat, inputs, targets)
    with torch.no_grad():
        expected_loss = float(nn.functional.cross_entropy(flat.module(inputs), targets))
    assert loss == pytest.approx(expected_loss, rel=1e-6)
    assert np.count_nonzero(flat.grads_np) > 0
    np.testing.assert_allclose(
        flat.grads_np, reference_grads(flat, inputs, targets), rtol=1e-5, atol=1e-7
    )
    for parameter in flat.module.parameters():  # backward left every grad a view of the buffer
        assert parameter.grad is not None
        ptr = parameter.grad.data_ptr()
        assert flat.grads.data_ptr() <= ptr < flat.grads.data_ptr() + 4 * SMALL.num_keys


def test_a_second_train_step_does_not_accumulate() -> None:
    flat = FlatModel(SMALL, seed=0)
    inputs, targets = torch.randn(16, 6), torch.randint(0, 3, (16,))
    train_step(flat, inputs, targets)
    first = flat.grads_np.copy()
    train_step(flat, inputs, targets)
    np.testing.assert_array_equal(flat.grads_np, first)
    other_inputs = torch.randn(16, 6)
    train_step(flat, other_inputs, targets)
    np.testing.assert_allclose(
        flat.grads_np, reference_grads(flat, other_inputs, targets), rtol=1e-5, atol=1e-7
    )


def test_zero_grad_clears_the_buffer() -> None:
    flat = FlatModel(SMALL, seed=0)
    train_step(flat, torch.randn(4, 6), torch.tensor([0, 1, 2, 0]))
    flat.zero_grad()
    assert not np.any(flat.grads_np)
    assert all(not torch.any(p.grad) for p in flat.module.parameters())  # type: ignore[arg-type]


def test_evaluate_counts_accuracy_and_mean_loss_over_batches() -> None:
    flat = FlatModel(SMALL, seed=0)
    flat.params_np[:] = 0.0
    last_bias = SMALL.segments()[-1].keys
    flat.params_np[last_bias.start : last_bias.end] = [0.0, 5.0, 0.0]  # always predicts class 1
    inputs = torch.randn(10, 6)
    targets = torch.tensor([1, 1, 1, 0, 2, 1, 0, 1, 2, 1])
    accuracy, loss = evaluate(flat.module, inputs, targets, batch_size=3)
    assert accuracy == pytest.approx(0.6)
    log_z = float(np.log(2 + np.exp(5.0)))
    expected = (6 * (log_z - 5.0) + 4 * log_z) / 10
    assert loss == pytest.approx(expected, rel=1e-5)


def test_a_registered_model_is_named_laid_out_and_asked_for_its_capabilities() -> None:
    from engine.config import ModelConfig
    from engine.models.kinds import MODELS, SPARSE_ROWS, BuiltinModel, trains_sparse_rows
    from engine.models.spec import builtin_layout, check_model, model_file
    from engine.registry import Lazy

    assert MODELS.able(SPARSE_ROWS) == ("logreg", "embedding")
    assert not trains_sparse_rows("/abs/model.py:build")  # a user's file: no capabilities
    one_weight = Lazy(f"{__name__}:one_weight")
    with MODELS.registered("tiny", BuiltinModel(one_weight, Lazy("x:y")), "one weight",
                           capabilities=frozenset({SPARSE_ROWS})):
        assert check_model(" Tiny ") == "tiny" and model_file("tiny") is None
        assert builtin_layout(ModelConfig(name="tiny", hidden=()), (4,), 3).num_keys == 3
        assert trains_sparse_rows("tiny")
        with pytest.raises(ConfigError, match="train --model logreg or embedding or tiny"):
            builtin_layout(ModelConfig(name="mlp", hidden=()), (4,), 2, sparse=True)
    with pytest.raises(ConfigError,
                       match="use mlp, cnn, logreg, embedding or path/to/file.py:build"):
        check_model("tiny")


def one_weight(hidden: tuple[int, ...], shape: tuple[int, ...], classes: int) -> KeyLayout:
    """A stand-in model's layout: one weight per class."""
    return KeyLayout((Segment("w", (classes,), KeyRange(0, classes)),))
