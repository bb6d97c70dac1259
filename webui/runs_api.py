"""The runs table's API: per-run metrics for sorting, config filters, and tag and note edits
(written through :mod:`engine.recorder`, the one module that writes the database)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/api")
