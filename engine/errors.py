"""The one exception tree of psctl.

Every error psctl raises on purpose is a :class:`PsctlError`. Foreign exceptions (websockets,
SQLAlchemy, OS errors, torch) are translated into one of these at the module that talks to the
foreign library, so callers only ever need to catch this tree. Each class carries a message meant
for a person: what went wrong and, where possible, what to do about it.
"""

from __future__ import annotations


class PsctlError(Exception):
    """Base of every error psctl raises deliberately."""


# -- configuration and launch -------------------------------------------------------------------


class ConfigError(PsctlError):
    """A configuration value, file or option combination is invalid."""


class LaunchError(PsctlError):
    """A run could not be started, or one of its processes failed to come up."""


class RunFailed(PsctlError):
    """A run ended in failure; the message names the process and the reason."""


class Diverged(RunFailed):
    """Training produced a loss or a gradient that is not finite: the run cannot go on."""


class MetricError(PsctlError, ValueError):
    """A ``psctl.log`` call from the user's own code was refused: a name that is not a short
    identifier, a value that is not one finite number, or one metric name too many. Raised in
    the user's code, where the call is, and reported as that code's crash."""


# -- data ---------------------------------------------------------------------------------------


class DataError(PsctlError):
    """A data set could not be found, fetched, verified or parsed."""


class DatasetNotFound(DataError):
    """No local copy of the data set exists and it could not be downloaded."""


class ChecksumMismatch(DataError):
    """A data file exists but its checksum differs from the published one."""


class DatasetFormatError(DataError):
    """A data file is not in the format its name promises (e.g. a corrupt IDX file)."""


# -- wire protocol ------------------------------------------------------------------------------


class ProtocolError(PsctlError):
    """A message violates the wire protocol; the peer gets this text as the error reason."""


class FrameTooLarge(ProtocolError):
    """A frame exceeds the configured size limit."""


class BadPayload(ProtocolError):
    """A frame's payload disagrees with its header (dtype, shape, key range, finiteness)."""


class NonFinitePush(BadPayload):
    """A pushed gradient holds NaN or infinity: the worker's model diverged."""


# -- transport and cluster ----------------------------------------------------------------------


class TransportError(PsctlError):
    """A connection could not be made, or broke."""


class ConnectFailed(TransportError):
    """No connection could be made to the named address."""


class ConnectionClosed(TransportError):
    """The peer closed the connection (the reason, when known, is in the message; the
    websocket close code, when one came, in ``code``)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class AuthenticationError(TransportError):
    """The peer refused our join token, or we refused theirs."""


class RequestTimeout(PsctlError, TimeoutError):
    """A wait ran past its timeout."""


class RemoteError(PsctlError):
    """A peer answered a request with an error reply."""


class ShuttingDown(PsctlError):
    """The cluster is stopping; the request was not served."""


# -- storage ------------------------------------------------------------------------------------


class StoreError(PsctlError):
    """The experiments database could not be opened, read or written."""


class RunNotFound(StoreError):
    """No run matches the given id, prefix or name."""


class AmbiguousRun(RunNotFound):
    """A run id prefix or name matches more than one run; the message lists the candidates."""


class DuplicatePush(ProtocolError):
    """A worker pushed a clock it has already committed on that key range; refused and counted."""


class ShardFull(ProtocolError):
    """A sparse shard stores as many keys as it can hold; the push that needed more was refused
    and nothing changed."""


class UnsafeUpdate(BadPayload):
    """A push would make the parameters (or the optimizer's state) non-finite; it was refused
    and nothing changed."""
