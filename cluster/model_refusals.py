"""Why a base model's worker cannot start now (issue 33 item 4): written by whoever starts workers (the embedded
model pool of `lorahost serve`, lorahost/embedded_models.py), read by the API's cold-start wait
(api/cold_start.py), so a request held for a model that can never start is refused at once, and one that waits
for memory is told why when its wait ends."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelRefusal:
    """Why a model's worker does not start: `is_final` when it never will without the operator's change."""

    message: str
    is_final: bool


class ModelStartRefusals:
    """The current refusal per base model (thread-safe; empty when every wanted model can start)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refusals: dict[str, ModelRefusal] = {}

    def replace(self, refusals: Mapping[str, ModelRefusal]) -> None:
        """The refusals now (models not named have none)."""
        with self._lock:
            self._refusals = dict(refusals)

    def get(self, base_model: str) -> ModelRefusal | None:
        """The refusal of `base_model` now (None: nothing keeps its worker from starting)."""
        with self._lock:
            return self._refusals.get(base_model)
