"""Finding, verifying and downloading the files of a file-based data set.

Search order (first complete directory wins; see docs/datasets.md):

1. the ``data_dir`` argument (``--data-dir``),
2. the ``PSCTL_DATA_DIR`` environment variable,
3. the user cache, ``platformdirs.user_cache_dir("psctl")/datasets/<name>``,
4. a download from the spec's mirrors into that cache, when downloading is allowed.

For 1 and 2, ``DIR/<name>/`` is tried before ``DIR`` itself, so one variable can point at a
folder holding several data sets. A directory counts only when all four files are there; its
files are then checked against the published size and md5, and a mismatch is an error rather
than a reason to look further, because silently skipping a corrupt copy hides the problem.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path

import platformdirs

from engine.datasets.registry import DatasetSpec, FileSpec, owner_of
from engine.errors import ChecksumMismatch, DataError, DatasetNotFound

ENV_VAR = "PSCTL_DATA_DIR"
FETCH_TIMEOUT_S = 30.0

# (path, size, mtime_ns, inode) -> md5 of files already hashed in this process. Hashing costs
# about 35 ms for the 26 MB Fashion-MNIST file, a tenth of decoding it, so nothing is persisted:
# an on-disk record would need a writable place and its own invalidation for little gain.
_VERIFIED: dict[tuple[str, int, int, int], str] = {}


def cache_root() -> Path:
    """Where downloads go: one subdirectory per data set."""
    return Path(platformdirs.user_cache_dir("psctl")) / "datasets"


def clear_verification_cache() -> None:
    """Forget which files were already verified in this process."""
    _VERIFIED.clear()


def find_files(spec: DatasetSpec, data_dir: Path | None, *, allow_download: bool) -> Path:
    """The directory holding ``spec``'s verified files, downloading them if needed and allowed.

    Raises DatasetNotFound (listing every place looked), ChecksumMismatch or DataError.
    """
    files = _files_of(spec)
    looked: list[str] = []
    for label, base in _search_roots(data_dir, looked):
        found = _probe_root(spec, base, label, files, looked)
        if found is not None:
            verify_files(found, files)
            return found.resolve()
    cache = cache_root() / spec.name
    reason = _probe(cache, files)
    if reason is not None:
        looked.append(f"{cache} (user cache): {reason}")
        if not allow_download:
            looked.append("download: not attempted (downloading is disabled)")
            raise DatasetNotFound(_not_found_message(spec, looked))
    if allow_download:
        # Also taken with a complete cache: only files failing their checks are fetched again.
        _download(spec, cache, looked)
    else:
        verify_files(cache, files)
    return cache.resolve()


def verify_files(directory: Path, files: tuple[FileSpec, ...]) -> None:
    for file in files:
        verify_file(directory / file.name, file)


def verify_file(path: Path, file: FileSpec) -> None:
    """Check size and md5 of ``path`` against ``file``; ChecksumMismatch names both sums."""
    try:
        st = path.stat()
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from exc
    key = (str(path.absolute()), st.st_size, st.st_mtime_ns, st.st_ino)
    if _VERIFIED.get(key) == file.md5:
        return
    # The size check alone would be instant, but the md5 is computed even when sizes differ so
    # that the message can say which file this really is.
    actual = md5_of_file(path)
    if st.st_size != file.size or actual != file.md5:
        raise ChecksumMismatch(_mismatch_message(path, file, st.st_size, actual))
    _VERIFIED[key] = actual


def md5_of_file(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, _md5).hexdigest()
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from exc


def fetch_url(url: str, *, timeout: float, max_bytes: int) -> bytes:
    """GET ``url`` with ``timeout`` on every connect and read; DataError on any failure.

    Tests replace this function to serve local bytes, so nothing else here touches the network.
    """
    # Imported here: urllib.request pulls in http.client and ssl, which the CLI need not pay for.
    import http.client
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data: bytes = response.read(max_bytes + 1)
    except urllib.error.HTTPError as exc:
        raise DataError(f"HTTP {exc.code} {exc.reason}") from exc
    except urllib.error.URLError as exc:
        raise DataError(f"cannot connect ({exc.reason})") from exc
    except TimeoutError as exc:
        raise DataError(f"no answer within {timeout:g} s") from exc
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise DataError(f"download failed ({type(exc).__name__}: {exc})") from exc
    if len(data) > max_bytes:
        raise DataError(f"server sent more than the expected {max_bytes} bytes")
    return data


def _md5() -> hashlib._Hash:
    # usedforsecurity=False: md5 here detects corruption only, and FIPS builds refuse it otherwise.
    return hashlib.md5(usedforsecurity=False)


def _files_of(spec: DatasetSpec) -> tuple[FileSpec, ...]:
    if spec.files is None:
        raise DataError(f"data set {spec.name!r} is bundled and has no files to find")
    return spec.files.all()


def _search_roots(data_dir: Path | None, looked: list[str]) -> list[tuple[str, Path]]:
    roots: list[tuple[str, Path]] = []
    if data_dir is not None:
        roots.append(("--data-dir", Path(data_dir).expanduser()))
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        roots.append((f"${ENV_VAR}", Path(env).expanduser()))
    else:
        looked.append(f"${ENV_VAR}: not set")
    return roots


def _probe_root(
    spec: DatasetSpec, base: Path, label: str, files: tuple[FileSpec, ...], looked: list[str]
) -> Path | None:
    """``base/<name>`` or else ``base`` when complete; otherwise note why each failed."""
    if not base.is_dir():
        looked.append(f"{base.absolute()} ({label}): {_probe(base, files)}")
        return None
    for candidate in (base / spec.name, base):
        reason = _probe(candidate, files)
        if reason is None:
            return candidate
        looked.append(f"{candidate.absolute()} ({label}): {reason}")
    return None


def _probe(directory: Path, files: tuple[FileSpec, ...]) -> str | None:
    """None if ``directory`` holds every file, else why it does not count."""
    if not directory.exists():
        return "does not exist"
    if not directory.is_dir():
        return "is not a directory"
    missing = [f.name for f in files if not (directory / f.name).is_file()]
    if len(missing) == len(files):
        return "has none of the files"
    return f"missing {', '.join(missing)}" if missing else None


def _download(spec: DatasetSpec, dest: Path, looked: list[str]) -> None:
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(
            f"cannot create the download cache {dest}: {exc.strerror or exc}; pass --data-dir "
            f"or set {ENV_VAR} to a directory holding the files instead"
        ) from exc
    for file in _files_of(spec):
        target = dest / file.name
        if not _already_good(target, file):
            _fetch_into(spec, file, target, looked)


def _already_good(target: Path, file: FileSpec) -> bool:
    if not target.is_file():
        return False
    try:
        verify_file(target, file)
    except ChecksumMismatch:
        return False  # a broken copy in our own cache is simply fetched again
    return True


def _fetch_into(spec: DatasetSpec, file: FileSpec, target: Path, looked: list[str]) -> None:
    failures: list[str] = []
    for mirror in spec.mirrors:
        url = mirror + file.name
        try:
            data = fetch_url(url, timeout=FETCH_TIMEOUT_S, max_bytes=file.size)
            _check_download(data, file)
        except DataError as exc:
            failures.append(f"download {url}: {exc}")
            continue
        _write_atomically(target, data)
        verify_file(target, file)  # cheap here, and records the file as verified
        return
    looked.extend(failures or [f"download: no mirrors known for {spec.name}"])
    raise DatasetNotFound(_not_found_message(spec, looked))


def _check_download(data: bytes, file: FileSpec) -> None:
    actual = hashlib.md5(data, usedforsecurity=False).hexdigest()
    if len(data) != file.size or actual != file.md5:
        raise DataError(
            f"got {len(data)} bytes with md5 {actual}, expected {file.size} bytes with md5 "
            f"{file.md5}; discarded"
        )


def _write_atomically(target: Path, data: bytes) -> None:
    """Write via a temp file and rename, so a reader never sees half a file."""
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    except OSError as exc:
        raise DataError(f"cannot write into {target.parent}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise DataError(f"cannot write {target}: {exc.strerror or exc}") from exc
        raise


def _mismatch_message(path: Path, file: FileSpec, size: int, actual: str) -> str:
    message = (
        f"{path}: md5 {actual} ({size} bytes) does not match the published md5 {file.md5} "
        f"({file.size} bytes) of {file.name}."
    )
    owner = owner_of(size, actual)
    if owner is not None:
        return f"{message} This file is {owner}: is the directory for the wrong data set?"
    return (
        f"{message} The file is corrupt, truncated or from another release: delete it and "
        "fetch it again."
    )


def _not_found_message(spec: DatasetSpec, looked: list[str]) -> str:
    names = ", ".join(f.name for f in _files_of(spec))
    places = "\n".join(f"  - {place}" for place in looked)
    return (
        f"data set {spec.name!r} not found. Looked in:\n{places}\n"
        f"To fix: pass --data-dir DIR where DIR or DIR/{spec.name} holds the four files "
        f"({names}), or set {ENV_VAR}=DIR, or use --dataset digits, which needs no network."
    )
