"""The compare page's API: the table ``psctl compare --json`` prints, for the runs shown."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/api")
