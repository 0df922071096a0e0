"""How big a request is: Chameleon's weighted request size (for size classes) and its need in KV tokens
(for quotas). Plain numbers in, numbers out.

Weighted request size (Chameleon):
    WRS = (A * In / MaxIn + B * Out_pred / MaxOut) * AdapterSize / MaxAdapterSize,   A = 0.4, B = 0.6
with the maxima taken from a window of recent requests (`SizeScale.of`). A request without an adapter
(the base model) costs no adapter memory, but a factor of 0 would put every base-model request in the
smallest class whatever its length; so its adapter size is floored at the smallest nonzero adapter size in
the window (the cheapest adapter seen): its token lengths still order it. A window with no adapter at all
gives every request the factor 1.

Need in tokens: prompt tokens + predicted output tokens + the adapter's device memory expressed in KV
tokens (its bytes rounded up to whole KV blocks, times the block size).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

INPUT_WEIGHT = 0.4  # A
OUTPUT_WEIGHT = 0.6  # B


@dataclass(frozen=True)
class RequestShape:
    """The size-relevant facts of one request."""

    num_prompt_tokens: int
    num_output_tokens: int  # predicted
    num_adapter_bytes: int  # 0: base model


@dataclass(frozen=True)
class SizeScale:
    """Normalisers of the weighted request size, from a window of recent requests."""

    max_prompt_tokens: int = 1
    max_output_tokens: int = 1
    max_adapter_bytes: int = 1
    min_adapter_bytes: int = 1  # the floor for base-model requests: the smallest nonzero adapter seen

    @classmethod
    def of(cls, shapes: Iterable[RequestShape]) -> SizeScale:
        """The maxima (and the adapter floor) over `shapes`; 1 where the window has nothing nonzero."""
        shapes = list(shapes)
        adapter_bytes = [s.num_adapter_bytes for s in shapes if s.num_adapter_bytes > 0]
        return cls(
            max_prompt_tokens=max([1, *(s.num_prompt_tokens for s in shapes)]),
            max_output_tokens=max([1, *(s.num_output_tokens for s in shapes)]),
            max_adapter_bytes=max(adapter_bytes, default=1),
            min_adapter_bytes=min(adapter_bytes, default=1),
        )

    def adapter_factor(self, num_adapter_bytes: int) -> float:
        """AdapterSize / MaxAdapterSize, with base-model requests floored at the smallest adapter."""
        size = num_adapter_bytes if num_adapter_bytes > 0 else self.min_adapter_bytes
        return size / self.max_adapter_bytes


def weighted_request_size(
    shape: RequestShape,
    scale: SizeScale,
    input_weight: float = INPUT_WEIGHT,
    output_weight: float = OUTPUT_WEIGHT,
) -> float:
    """Chameleon's WRS of one request under `scale` (in [0, 1] for requests inside the window)."""
    token_part = (
        input_weight * shape.num_prompt_tokens / scale.max_prompt_tokens
        + output_weight * shape.num_output_tokens / scale.max_output_tokens
    )
    return token_part * scale.adapter_factor(shape.num_adapter_bytes)


def num_adapter_tokens(num_adapter_bytes: int, num_bytes_per_block: int, block_size: int) -> int:
    """An adapter's device memory as KV tokens: its bytes in whole blocks, times the block size.

    0 without an adapter or when the bytes per block are unknown (0).
    """
    if num_adapter_bytes <= 0 or num_bytes_per_block <= 0:
        return 0
    return -(-num_adapter_bytes // num_bytes_per_block) * block_size
