"""Where data files are looked for, how they are verified, and how downloads land in the cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets_support import StandIn, Tiny, make_tiny

from engine.datasets import locate, resolve
from engine.datasets.resolve import ENV_VAR
from engine.datasets.resolve import fetch_url as real_fetch_url
from engine.errors import ChecksumMismatch, DataError, DatasetNotFound

# -- search order -------------------------------------------------------------------------------


def test_data_dir_holding_the_files_directly(tiny: Tiny) -> None:
    assert locate("tiny", tiny.dir) == str(tiny.dir.resolve())


def test_data_dir_holding_a_named_subfolder(tiny: Tiny) -> None:
    assert locate("tiny", tiny.dir.parent) == str(tiny.dir.resolve())


def test_named_subfolder_wins_over_files_directly_in_the_dir(tiny: Tiny, tmp_path: Path) -> None:
    root = tiny.copy_to(tmp_path / "both")
    sub = tiny.copy_to(root / "tiny")
    assert locate("tiny", root) == str(sub.resolve())


def test_env_var_is_used_without_an_argument(tiny: Tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(tiny.dir.parent))
    assert locate("tiny") == str(tiny.dir.resolve())


def test_argument_wins_over_env_var(
    tiny: Tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tiny.copy_to(tmp_path / "other")
    monkeypatch.setenv(ENV_VAR, str(tiny.dir))
    assert locate("tiny", other) == str(other.resolve())


def test_env_var_wins_over_cache(
    tiny: Tiny, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny.copy_to(isolated / "tiny")
    monkeypatch.setenv(ENV_VAR, str(tiny.dir))
    assert locate("tiny") == str(tiny.dir.resolve())


def test_cache_is_used_last(tiny: Tiny, isolated: Path) -> None:
    cached = tiny.copy_to(isolated / "tiny")
    assert locate("tiny") == str(cached.resolve())


def test_incomplete_argument_dir_falls_through(
    tiny: Tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    partial = tiny.copy_to(tmp_path / "partial")
    (partial / "test-labels.gz").unlink()
    monkeypatch.setenv(ENV_VAR, str(tiny.dir))
    assert locate("tiny", partial) == str(tiny.dir.resolve())


def test_tilde_in_paths_is_expanded(tiny: Tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tiny.dir.parent))
    assert locate("tiny", Path("~/tiny")) == str(tiny.dir.resolve())


# -- not found ----------------------------------------------------------------------------------


def test_not_found_lists_every_place_and_the_fixes(
    tiny: Tiny, tmp_path: Path, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    partial = tiny.copy_to(tmp_path / "partial")
    (partial / "train-images.gz").unlink()
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env-dir"))
    with pytest.raises(DatasetNotFound) as info:
        locate("tiny", partial)
    message = str(info.value)
    assert f"{partial / 'tiny'} (--data-dir): does not exist" in message
    assert f"{partial} (--data-dir): missing train-images.gz" in message
    assert f"{tmp_path / 'env-dir'} (${ENV_VAR}): does not exist" in message
    assert f"{isolated / 'tiny'} (user cache): does not exist" in message
    assert "download: not attempted" in message
    for fix in ("--data-dir DIR", f"{ENV_VAR}=DIR", "--dataset digits", "needs no network"):
        assert fix in message
    for file in tiny.blobs:
        assert file in message


def test_not_found_mentions_an_unset_env_var(tiny: Tiny) -> None:
    with pytest.raises(DatasetNotFound, match=rf"\${ENV_VAR}: not set"):
        locate("tiny")


def test_a_file_instead_of_a_directory(tiny: Tiny, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(DatasetNotFound, match=r"file \(--data-dir\): is not a directory"):
        locate("tiny", not_a_dir)


# -- checksums ----------------------------------------------------------------------------------


def test_changed_byte_is_a_checksum_mismatch(tiny: Tiny) -> None:
    path = tiny.dir / "train-labels.gz"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    expected = tiny.spec.files.train_labels.md5  # type: ignore[union-attr]
    with pytest.raises(ChecksumMismatch) as info:
        locate("tiny", tiny.dir)
    message = str(info.value)
    assert str(path) in message and expected in message
    assert resolve.md5_of_file(path) in message
    assert "delete it and fetch it again" in message


def test_wrong_size_is_a_checksum_mismatch(tiny: Tiny) -> None:
    path = tiny.dir / "test-images.gz"
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(ChecksumMismatch, match=r"test-images\.gz"):
        locate("tiny", tiny.dir)


def test_mismatch_names_the_data_set_the_file_belongs_to(
    tiny: Tiny, tmp_path: Path, stand_in: StandIn
) -> None:
    # Like pointing --dataset mnist at a Fashion-MNIST folder: same file names, other contents.
    other = make_tiny(tmp_path / "other", "tiny2", seed=2)
    stand_in(other.spec)
    with pytest.raises(ChecksumMismatch, match=r"This file is tiny2/train-images\.gz"):
        locate("tiny", other.dir)


def test_verification_is_remembered_until_the_file_changes(
    tiny: Tiny, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    real = resolve.md5_of_file

    def counting(path: Path) -> str:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(resolve, "md5_of_file", counting)
    locate("tiny", tiny.dir)
    locate("tiny", tiny.dir)
    assert len(calls) == 4  # once per file, not once per call
    (tiny.dir / "test-labels.gz").write_bytes(b"changed")
    with pytest.raises(ChecksumMismatch):
        locate("tiny", tiny.dir)


# -- download -----------------------------------------------------------------------------------


class FakeMirrors:
    """Serves bytes by URL in place of the network, recording every request."""

    def __init__(self, served: dict[str, bytes | DataError]):
        self.served = served
        self.requests: list[tuple[str, float]] = []

    def __call__(self, url: str, *, timeout: float, max_bytes: int) -> bytes:
        self.requests.append((url, timeout))
        answer = self.served.get(url, DataError("cannot connect (Name or service not known)"))
        if isinstance(answer, DataError):
            raise answer
        return answer


def _serve(
    monkeypatch: pytest.MonkeyPatch, tiny: Tiny, mirror: int, **overrides: bytes
) -> FakeMirrors:
    base = tiny.spec.mirrors[mirror]
    served: dict[str, bytes | DataError] = {base + n: b for n, b in tiny.blobs.items()}
    served.update({base + n: b for n, b in overrides.items()})
    fake = FakeMirrors(served)
    monkeypatch.setattr(resolve, "fetch_url", fake)
    return fake


def test_download_lands_verified_in_the_cache(
    tiny: Tiny, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _serve(monkeypatch, tiny, mirror=0)
    assert locate("tiny", allow_download=True) == str((isolated / "tiny").resolve())
    assert sorted(p.name for p in (isolated / "tiny").iterdir()) == sorted(tiny.blobs)
    for name, blob in tiny.blobs.items():
        assert (isolated / "tiny" / name).read_bytes() == blob
    assert [url for url, _ in fake.requests] == [tiny.spec.mirrors[0] + n for n in tiny.blobs]
    assert all(0 < timeout <= 60 for _, timeout in fake.requests)
    # Now cached: found again without asking the network.
    fake.requests.clear()
    assert locate("tiny", allow_download=True) == str((isolated / "tiny").resolve())
    assert fake.requests == []


def test_download_falls_back_to_the_next_mirror(
    tiny: Tiny, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _serve(monkeypatch, tiny, mirror=1)
    locate("tiny", allow_download=True)
    assert len(fake.requests) == 8  # every file tried on mirror a, then fetched from b


def test_download_with_bad_bytes_is_discarded(
    tiny: Tiny, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _serve(monkeypatch, tiny, mirror=0, **{"train-images.gz": b"\x1f\x8bbroken"})
    with pytest.raises(DatasetNotFound) as info:
        locate("tiny", allow_download=True)
    message = str(info.value)
    assert "mirror-a.invalid/tiny/train-images.gz: got 8 bytes with md5" in message
    assert "mirror-b.invalid/tiny/train-images.gz: cannot connect" in message
    assert not (isolated / "tiny" / "train-images.gz").exists()
    assert not list((isolated / "tiny").glob(".*"))  # no temp files left behind


def test_offline_download_reports_each_url(tiny: Tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeMirrors({})
    monkeypatch.setattr(resolve, "fetch_url", fake)
    with pytest.raises(DatasetNotFound) as info:
        locate("tiny", allow_download=True)
    assert len(fake.requests) == 2  # gives up after the first file fails everywhere
    for mirror in tiny.spec.mirrors:
        assert f"download {mirror}train-images.gz: cannot connect" in str(info.value)
    assert "--dataset digits" in str(info.value)


def test_download_fetches_only_missing_or_broken_files(
    tiny: Tiny, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tiny.copy_to(isolated / "tiny")
    (cache / "train-labels.gz").unlink()
    (cache / "test-images.gz").write_bytes(b"stale")
    fake = _serve(monkeypatch, tiny, mirror=0)
    locate("tiny", allow_download=True)
    assert sorted(url.rsplit("/", 1)[1] for url, _ in fake.requests) == [
        "test-images.gz",
        "train-labels.gz",
    ]
    assert (cache / "test-images.gz").read_bytes() == tiny.blobs["test-images.gz"]


def test_broken_cache_without_download_is_a_mismatch(tiny: Tiny, isolated: Path) -> None:
    cache = tiny.copy_to(isolated / "tiny")
    (cache / "test-images.gz").write_bytes(b"stale")
    with pytest.raises(ChecksumMismatch, match=r"test-images\.gz"):
        locate("tiny")


def test_unwritable_cache_is_a_data_error(
    tiny: Tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setattr(resolve, "cache_root", lambda: blocker / "datasets")
    _serve(monkeypatch, tiny, mirror=0)
    with pytest.raises(DataError, match="cannot create the download cache"):
        locate("tiny", allow_download=True)


# -- the real fetch function, on file:// URLs (no network) --------------------------------------


def test_fetch_url_reads_bytes(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"12345")
    assert real_fetch_url(path.as_uri(), timeout=5, max_bytes=5) == b"12345"


def test_fetch_url_refuses_more_than_expected(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"123456")
    with pytest.raises(DataError, match="more than the expected 5 bytes"):
        real_fetch_url(path.as_uri(), timeout=5, max_bytes=5)


@pytest.mark.parametrize("url", ["file:///no/such/file", "not a url", "gopher://x/"])
def test_fetch_url_translates_failures(url: str) -> None:
    with pytest.raises(DataError):
        real_fetch_url(url, timeout=5, max_bytes=5)
