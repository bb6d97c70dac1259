"""The "against its source" tables of docs/consistency.md, learning.md and communication.md name
the tests that check psctl against each source: every one of them must exist."""

from __future__ import annotations

import ast
import re

import pytest

from tests.conftest import REPO

DOCS = ("consistency.md", "learning.md", "communication.md")
CITED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def cited(doc: str) -> list[tuple[str, str]]:
    return CITED.findall((REPO / "docs" / doc).read_text())


def defined(path: str) -> set[str]:
    tree = ast.parse((REPO / path).read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("doc", DOCS)
def test_every_check_a_doc_cites_exists(doc: str) -> None:
    references = cited(doc)
    assert len(references) >= 5, f"{doc} names no checks"
    missing = [f"{path}::{name}" for path, name in references
               if not (REPO / path).is_file() or name not in defined(path)]
    assert missing == []
