"""Admission: whom a connection speaks for, decided once at the handshake.

The launcher holds the run's secret (the join token). Every process it starts gets a credential
for its own role and rank only: ``role.rank.mac``, where ``mac`` is an HMAC of ``role.rank``
under the secret. A listener that knows the secret admits such a credential as exactly that role
and rank, so a worker holding its credential cannot speak for another worker, and cannot derive
another credential from its own. The secret itself admits the *operator*, who may speak for any
role (the coordinator, the shard servers, tools and tests hold it).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass

_CREDENTIAL = re.compile(
    r"(?P<role>[a-z]{1,16})\.(?P<rank>0|[1-9][0-9]{0,5})\.(?P<mac>[-_A-Za-z0-9]{43})")


@dataclass(frozen=True, slots=True)
class Admission:
    """The role and rank a connection was admitted as; both None for the operator."""

    role: str | None
    rank: int | None

    @property
    def operator(self) -> bool:
        return self.role is None

    def permits(self, role: str, rank: int) -> bool:
        return self.operator or (self.role == role and self.rank == rank)

    def __str__(self) -> str:
        return "the operator" if self.operator else f"{self.role} {self.rank}"


OPERATOR = Admission(None, None)


def credential(secret: str, role: str, rank: int) -> str:
    """The credential that admits its holder as ``role`` ``rank`` and nothing else."""
    return f"{role}.{rank}.{_mac(secret, role, rank)}"


def admit(secret: str, offered: str) -> Admission | None:
    """Whom ``offered`` admits under ``secret``: a role and rank, the operator, or nobody."""
    if hmac.compare_digest(offered.encode(), secret.encode()):
        return OPERATOR
    match = _CREDENTIAL.fullmatch(offered)
    if match is None:
        return None
    role, rank = match["role"], int(match["rank"])
    if hmac.compare_digest(match["mac"].encode(), _mac(secret, role, rank).encode()):
        return Admission(role, rank)
    return None


def _mac(secret: str, role: str, rank: int) -> str:
    digest = hmac.new(secret.encode(), f"psctl-admission/{role}/{rank}".encode(), hashlib.sha256)
    return base64.urlsafe_b64encode(digest.digest()).decode().rstrip("=")
