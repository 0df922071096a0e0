"""A request's state inside the engine: lives in the torch-free engine core (re-exported here)."""

from scheduler.core.sequence import BatchEntry, Sequence, SequenceStatus

__all__ = ["BatchEntry", "Sequence", "SequenceStatus"]
