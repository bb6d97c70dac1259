"""The models psctl builds by name (``--model``), what each can do, and where its key layout
(arithmetic, no torch: ``engine.models.spec``) and its torch module (``engine.models.build``)
are made, imported only when asked for. A plugin registers more; a user's file needs none.

A model registers its own settings as a policy does (``engine.registry``): a table named after
it in the model section (``[model.embedding]``), each field with a flag; and the settings it
implies, which a run that gives its own overrides (``engine.plan``)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from engine.config import flag
from engine.registry import Lazy, Registry


@dataclass(frozen=True)
class BuiltinModel:
    """On dense samples ``layout(hidden, input_shape, num_classes) -> KeyLayout`` and
    ``module(hidden, input_shape, num_classes) -> torch.nn.Module`` (None: it takes none); on
    sparse samples ``sparse(features, model) -> engine.models.rows.RowsModel`` (numpy), with
    ``model`` the run's ``ModelConfig`` (its widths and the model's own settings)."""

    layout: Lazy | None
    module: Lazy | None
    sparse: Lazy | None = None


# The embedding model's row width when the run gives none, and the widest it takes: a row is
# pulled and pushed whole for every feature a batch has.
DIM, MAX_DIM = 8, 256


class EmbeddingSettings(BaseModel):
    """``--model embedding``'s own settings, the table ``[model.embedding]``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dim: int = Field(DIM, ge=1, le=MAX_DIM, json_schema_extra=flag("--embedding-dim"),
                     description=(f"--model embedding: values in each feature's row of the "
                                  f"embedding table, 1 to {MAX_DIM} [{DIM}]"))


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
                capabilities=frozenset({SPARSE_ROWS}), settings=EmbeddingSettings,
                # SGD at its lr 0.1 with momentum 0.9 diverged under four asynchronous workers;
                # Adagrad at its own lr (0.005) trained (docs/models.md): the rate follows the
                # optimizer, so that a run naming another one gets that one's rate.
                implies={"optimizer.name": "adagrad"})


def trains_sparse_rows(model: str) -> bool:
    """Whether ``model`` (a name, or a user's file) trains on sparse samples."""
    return model in MODELS and MODELS.can(model, SPARSE_ROWS)
