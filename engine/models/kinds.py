"""The models psctl builds by name (``--model``), what each can do, and where its key layout
(arithmetic, no torch: ``engine.models.spec``) and its torch module (``engine.models.build``)
are made, imported only when asked for. A plugin registers more; a user's file needs none."""

from __future__ import annotations

from dataclasses import dataclass

from engine.registry import Lazy, Registry


@dataclass(frozen=True)
class BuiltinModel:
    """On dense samples ``layout(hidden, input_shape, num_classes) -> KeyLayout`` and
    ``module(hidden, input_shape, num_classes) -> torch.nn.Module`` (None: it takes none); on
    sparse samples ``sparse(features, hidden) -> engine.models.rows.RowsModel`` (numpy)."""

    layout: Lazy | None
    module: Lazy | None
    sparse: Lazy | None = None


# A model that trains on sparse samples, one weight per feature (binary logistic regression).
SPARSE_ROWS = "sparse_rows"
MODELS: Registry[BuiltinModel] = Registry("model")
MODELS.register("mlp", BuiltinModel(Lazy("engine.models.spec:mlp_layout"),
                                    Lazy("engine.models.build:mlp")),
                "a fully connected ReLU network with --hidden layers")
MODELS.register("cnn", BuiltinModel(Lazy("engine.models.spec:cnn_layout"),
                                    Lazy("engine.models.build:cnn")),
                "LeNet (two convolutions, 500 hidden units, dropout); images only")
MODELS.register("logreg", BuiltinModel(Lazy("engine.models.spec:logreg_layout"),
                                       Lazy("engine.models.build:logreg"),
                                       Lazy("engine.models.logreg:sparse_model")),
                "(multinomial) logistic regression; binary on sparse data sets",
                capabilities=frozenset({SPARSE_ROWS}))
MODELS.register("embedding", BuiltinModel(None, None, Lazy("engine.models.embedding:sparse_model")),
                "a click model of sparse samples: an embedding table (a sparse key range) summed "
                "per sample, one ReLU layer of the first model.hidden width, a logistic output",
                capabilities=frozenset({SPARSE_ROWS}))


def trains_sparse_rows(model: str) -> bool:
    """Whether ``model`` (a name, or a user's file) trains on sparse samples."""
    return model in MODELS and MODELS.can(model, SPARSE_ROWS)
