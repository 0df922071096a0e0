"""`Workload`: what the planner plans for: adapters (rank, request rate, optional tenant and device bytes) and
the prompt and output length distributions, from a YAML/JSON file or a dict; `WorkloadError` names the file and
the field to fix.

File shape (docs/examples/plan-workload.yaml):
    prompt_tokens: {p50: 400, p90: 1500, max: 4000}   # log-normal through p50 and p90, cut at max
    output_tokens: {p50: 150, p90: 400}
    adapters:
      - {name: support-bot, rank: 16, rate: 2.0, tenant: acme}
      - {name: tail, count: 40, rank: 8, rate: 0.05}  # 40 adapters tail-0 .. tail-39
Rates are requests per second; `num_bytes` (device bytes) defaults to the profile's size for the rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import NormalDist
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from twin.model_file import read_file_content, validate_file_content

_STANDARD_NORMAL = NormalDist()
_Z90 = _STANDARD_NORMAL.inv_cdf(0.9)


class WorkloadError(ValueError):
    """A workload that cannot be planned; the message names the origin and what to fix."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LengthDistribution(_Frozen):
    """Token lengths: log-normal through `p50` and `p90` (p90 = p50: a fixed length), cut to [1, max]."""

    p50: float = Field(gt=0)
    p90: float | None = Field(default=None, gt=0)
    max: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> LengthDistribution:
        if self.p90 is not None and self.p90 < self.p50:
            raise ValueError(f"p90 ({self.p90}) is below p50 ({self.p50})")
        if self.max is not None and self.max < self.p50:
            raise ValueError(f"max ({self.max}) is below p50 ({self.p50})")
        return self

    @property
    def sigma(self) -> float:
        """The log-normal's shape (0: fixed length)."""
        return 0.0 if self.p90 is None else math.log(self.p90 / self.p50) / _Z90

    @property
    def upper(self) -> int:
        """The largest length drawn: `max`, else the 99.9th percentile."""
        return self.max if self.max is not None else max(1, round(self.p50 * math.exp(3.09 * self.sigma)))

    @property
    def mean(self) -> float:
        """The (uncut) log-normal mean."""
        return min(self.p50 * math.exp(self.sigma**2 / 2), float(self.upper))

    def quantile(self, q: float) -> float:
        """The `q` quantile (0 < q < 1), cut at `upper`."""
        return min(self.p50 * math.exp(self.sigma * _STANDARD_NORMAL.inv_cdf(q)), float(self.upper))


class AdapterLoad(_Frozen):
    """One adapter (or `count` alike, named `name-0` ..) and its demand."""

    name: str = Field(min_length=1)
    rank: int = Field(gt=0)
    rate: float = Field(ge=0)  # requests per second (each of the `count`)
    tenant: str | None = None
    num_bytes: int | None = Field(default=None, gt=0)
    count: int = Field(default=1, gt=0)


class Workload(_Frozen):
    """A workload file's content (module doc)."""

    prompt_tokens: LengthDistribution
    output_tokens: LengthDistribution
    adapters: list[AdapterLoad] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> Workload:
        names = [a.adapter_id for a in self.expanded()]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"adapter names repeat: {duplicates[:5]}")
        if sum(a.rate for a in self.expanded()) <= 0:
            raise ValueError("every adapter has rate 0: nothing to plan")
        return self

    def expanded(self) -> list[PlannedAdapter]:
        """One entry per adapter (groups with `count` > 1 unrolled)."""
        out = []
        for a in self.adapters:
            ids = [a.name] if a.count == 1 else [f"{a.name}-{i}" for i in range(a.count)]
            out += [PlannedAdapter(i, a.rank, a.rate, a.tenant, a.num_bytes) for i in ids]
        return out


@dataclass(frozen=True)
class PlannedAdapter:
    """One adapter as the planner places it (a hot adapter's share has a fraction of its rate)."""

    adapter_id: str
    rank: int
    rate: float
    tenant: str | None = None
    num_bytes: int | None = None

    def share(self, num_shares: int) -> PlannedAdapter:
        """The same adapter carrying 1/`num_shares` of the rate (one replica of a hot adapter)."""
        return replace(self, rate=self.rate / num_shares)


def workload_from_dict(data: Any, origin: str = "<workload>") -> Workload:
    """Validate a workload's content; WorkloadError naming `origin` and each field to fix."""
    return validate_file_content(Workload, data, origin, "workload", WorkloadError)


def load_workload(path: Path | str) -> Workload:
    """Read and validate a workload file (YAML by suffix .yaml/.yml, else JSON)."""
    path = Path(path)
    return workload_from_dict(read_file_content(path, "workload", WorkloadError), str(path))
