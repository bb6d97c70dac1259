"""The data sets psctl knows by name: shapes, published files and where to fetch them.

The byte sizes and md5 sums are those of the canonical public releases. They are the only thing
that makes a directory of files trustworthy, whichever mirror or local copy they came from.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import ConfigError
from engine.registry import Registry


@dataclass(frozen=True)
class FileSpec:
    """One published file: its name, exact size in bytes and md5 (lower-case hex)."""

    name: str
    size: int
    md5: str


@dataclass(frozen=True)
class IdxFiles:
    """The four IDX files of an MNIST-style release."""

    train_images: FileSpec
    train_labels: FileSpec
    test_images: FileSpec
    test_labels: FileSpec

    def all(self) -> tuple[FileSpec, ...]:
        return (self.train_images, self.train_labels, self.test_images, self.test_labels)


@dataclass(frozen=True)
class DatasetSpec:
    """A named data set.

    ``files`` is ``None`` for a data set that ships inside a Python package (``digits``) and so
    needs neither a directory nor the network; ``mirrors`` are base URLs tried in order, each
    ending in ``/`` so that ``mirror + file.name`` is the file's URL.
    """

    name: str
    description: str
    input_dim: int
    num_classes: int
    files: IdxFiles | None = None
    mirrors: tuple[str, ...] = ()
    # The shape of one sample, (channels, height, width) for images; () means (input_dim,).
    input_shape: tuple[int, ...] = ()
    # Samples are sparse rows (``engine.datasets.sparse``): only --model logreg takes them.
    sparse: bool = False

    @property
    def needs_files(self) -> bool:
        return self.files is not None

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.input_shape or (self.input_dim,)


def _mnist_style(
    name: str, description: str, sums: tuple[tuple[int, str], ...], mirrors: tuple[str, ...]
) -> DatasetSpec:
    # Both MNIST and Fashion-MNIST publish the same four file names; only sizes and sums differ.
    names = (
        "train-images-idx3-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    )
    specs = [FileSpec(n, size, md5) for n, (size, md5) in zip(names, sums, strict=True)]
    return DatasetSpec(
        name=name,
        description=description,
        input_dim=28 * 28,
        num_classes=10,
        files=IdxFiles(*specs),
        mirrors=mirrors,
        input_shape=(1, 28, 28),
    )


MNIST = _mnist_style(
    "mnist",
    "MNIST handwritten digits, 28x28 grey, 60000 train / 10000 test",
    (
        (9912422, "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
        (28881, "d53e105ee54ea40749a09fcbcd1e9432"),
        (1648877, "9fb629c4189551a2d022fa330f9573f3"),
        (4542, "ec29112dd5afa0611ce80d1b7f02629c"),
    ),
    (
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "https://storage.googleapis.com/cvdf-datasets/mnist/",
    ),
)

FASHION_MNIST = _mnist_style(
    "fashion-mnist",
    "Zalando Fashion-MNIST clothing images, 28x28 grey, 60000 train / 10000 test",
    (
        (26421880, "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
        (29515, "25c81989df183df01b3e8a0aad5dffbe"),
        (4422102, "bef4ecab320f06d8554ea6380940ec79"),
        (5148, "bb300cfdad3c16e7a12a480ee83cd310"),
    ),
    # Plain HTTP is what the project publishes; the md5 check is what makes it safe to use.
    ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
)

DIGITS = DatasetSpec(
    name="digits",
    description="scikit-learn's bundled 8x8 digits, 1797 samples; needs no network",
    input_dim=64,
    num_classes=10,
    input_shape=(1, 8, 8),
)

# The data sets psctl knows by name (a plugin registers more; ``DATASETS.registered`` stands one
# in for a test). A data set's files, if any, are checked against its sums wherever they come from.
DATASETS: Registry[DatasetSpec] = Registry("data set")
for _spec in (MNIST, FASHION_MNIST, DIGITS):
    DATASETS.register(_spec.name, _spec, _spec.description)


def dataset_names() -> list[str]:
    """Names accepted by :func:`get_spec`, sorted."""
    return sorted(DATASETS.names())


def get_spec(name: str) -> DatasetSpec:
    """The spec registered under ``name`` (case-insensitive); ConfigError if there is none."""
    key = name.strip().lower() if isinstance(name, str) else ""
    if key not in DATASETS:
        known = ", ".join(dataset_names())
        raise ConfigError(f"unknown data set {name!r}; known data sets: {known}")
    return DATASETS.get(key)


def owner_of(size: int, md5: str) -> str | None:
    """Which registered file has this size and md5, as ``"<data set>/<file>"``, if any.

    Used only to explain a checksum mismatch: MNIST and Fashion-MNIST share file names, so a
    directory of the wrong one is an easy mistake to make.
    """
    for name in DATASETS.names():
        spec = DATASETS.get(name)
        for file in spec.files.all() if spec.files else ():
            if file.size == size and file.md5 == md5:
                return f"{spec.name}/{file.name}"
    return None
