"""``path/to/file.py:function``: a user's model builder or data loader, named on the command line.

Checked by reading the file's syntax only (nothing of it runs in the CLI), so that a typo fails
before any process starts. The path is made absolute: every role process, wherever it was started
from, imports the same file.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from engine.errors import ConfigError


@dataclass(frozen=True, slots=True)
class FileRef:
    """``path/to/file.py:function``: a function in a user's Python file."""

    path: Path
    function: str

    def __str__(self) -> str:
        return f"{self.path}:{self.function}"


def parse_file_ref(text: str, *, what: str, default_function: str) -> FileRef | None:
    """``FILE.py[:FUNCTION]`` as a FileRef with an absolute path, or None when ``text`` does not
    name a ``.py`` file. The file must exist and define the function at its top level."""
    path_text, _, function = text.rpartition(":") if ":" in text else (text, "", "")
    if not path_text.endswith(".py"):
        path_text, function = text, ""
    if not path_text.endswith(".py"):
        return None
    function = function or default_function
    if not function.isidentifier():
        raise ConfigError(f"{what} {text!r}: {function!r} is not a Python function name")
    path = Path(path_text).expanduser().resolve()
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except OSError as exc:
        raise ConfigError(f"{what} {text!r}: cannot read {path}: {exc.strerror or exc}") from exc
    except (SyntaxError, ValueError) as exc:
        raise ConfigError(f"{what} {text!r}: {path} is not valid Python: {exc}") from exc
    defined = {node.name for node in tree.body
               if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    if function not in defined:
        listed = ", ".join(sorted(defined)) or "none"
        raise ConfigError(f"{what} {text!r}: {path} defines no top-level function {function!r} "
                          f"(functions defined there: {listed})")
    return FileRef(path, function)


def load_function(ref: FileRef, *, what: str) -> Callable[..., Any]:
    """The function ``ref`` names, its file imported once per process."""
    name = f"psctl_user_{hashlib.sha256(str(ref.path).encode()).hexdigest()[:16]}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, ref.path)
        if spec is None or spec.loader is None:
            raise ConfigError(f"{what} {ref}: cannot load {ref.path} as Python")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # a user's file may raise anything; say where it came from
            raise ConfigError(f"{what} {ref}: importing {ref.path} raised "
                              f"{type(exc).__name__}: {exc}") from exc
        sys.modules[name] = module
    function = getattr(module, ref.function, None)
    if not callable(function):
        raise ConfigError(f"{what} {ref}: {ref.path} has no function {ref.function!r}")
    return cast(Callable[..., Any], function)


def call_user_function(text: str, *args: Any, what: str) -> Any:
    """Call the function ``text`` (``file.py:function``) names; its errors say where they came
    from."""
    ref = parse_file_ref(text, what=what, default_function="load")
    if ref is None:
        raise ConfigError(f"{what} {text!r} does not name a .py file")
    function = load_function(ref, what=what)
    try:
        return function(*args)
    except Exception as exc:
        shown = ", ".join(repr(arg) for arg in args)
        raise ConfigError(f"{what} {ref}: {ref.function}({shown}) raised "
                          f"{type(exc).__name__}: {exc}") from exc
