"""ordo: the ordered transactional outbox and inbox, from Python.

A producer appends events to its outbox in the same transaction as its own
writes; ``ordo.relay`` hands them to a consumer's inbox; the consumer's
``apply(handler)`` applies each flow's events in order, exactly once, in
the transaction of the handler's own writes. See docs/python.md.
"""

from ordo._ordo import (
    APPLY,
    ApplyTransaction,
    ApplyVerdict,
    Block,
    Busy,
    CommitOutcomeUnknown,
    Consumer,
    Effect,
    EffectPolicy,
    Envelope,
    Error,
    Failed,
    HandlerError,
    InvalidInput,
    Producer,
    Report,
    Retry,
    Runner,
    StorageError,
    Transaction,
    Unknown,
    WrongDomain,
    relay,
)

__all__ = [
    "APPLY",
    "ApplyTransaction",
    "ApplyVerdict",
    "Block",
    "Busy",
    "CommitOutcomeUnknown",
    "Consumer",
    "Effect",
    "EffectPolicy",
    "Envelope",
    "Error",
    "Failed",
    "HandlerError",
    "InvalidInput",
    "Producer",
    "Report",
    "Retry",
    "Runner",
    "StorageError",
    "Transaction",
    "Unknown",
    "WrongDomain",
    "relay",
    "reservation",
]

from ordo import reservation  # noqa: E402  (the reference domain, after the names it uses)
