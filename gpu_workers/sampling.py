"""Per-request sampling parameters: plain data that lives in the torch-free engine core (re-exported here)."""

from scheduler.core.sampling import SamplingParams

__all__ = ["SamplingParams"]
