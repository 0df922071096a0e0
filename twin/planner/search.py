"""`search_plans`: the cheapest deployment that meets the SLO in the cluster twin.

The space (search_space.py): workers x max_num_seqs x memory mode and pool split x batch policy x placement.
Cost is the workers' price (`workers x price_per_gpu_hour`), so the search looks for the fewest workers for
which some setup meets the SLO, and the other dimensions are what lets fewer workers do:
1. The fast estimate (memory check + analytic load) prunes every candidate that cannot fit or keep up; the
   fewest workers any setup may do on the estimate is where the search starts.
2. A level is a worker count: its unpruned candidates are checked in the cluster twin (cluster_check.py) in
   this order, at most `max_checks_per_level` of them: the deployment's own setup, then the setups that change
   one dimension of it (lowest estimated load first), then the rest. The first that meets the SLO passes the
   level.
3. Galloping then bisection over the levels: up 1, 2, 4, ... workers until a level passes, then halving the gap
   between the highest failed and the lowest passed level (latency falls as workers are added).
4. The budget: at most `max_checks` twin checks, and no check starts after `max_search_s` wall seconds (one in
   flight finishes). A search that runs out says so; the cheapest passing plan found so far is still chosen.
The chosen plan is the lowest passing level's check, with its margin; the runners-up are every other check,
with why it lost (over the SLO, could not judge, or costlier than the chosen), and the pruned candidates are
counted by reason. A check window that holds no request judges nothing: the search stops and says it could not
judge.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from settings import Settings
from settings.engine import EngineSettings
from twin.planner.cluster_check import (
    DEFAULT_WARMUP_S,
    MEETS,
    NOT_JUDGED,
    CheckOutcome,
    check_candidate,
    window_requests,
)
from twin.planner.search_space import NO_PLACEMENT, Candidate, estimate, min_workers, reference_setup, setups
from twin.planner.slo import Slo
from twin.planner.workload import Workload
from twin.profile import TwinProfile

DEFAULT_MAX_CHECKS = 12
DEFAULT_MAX_SEARCH_S = 300.0
DEFAULT_MAX_CHECKS_PER_LEVEL = 3
MAX_WORKERS = 256


@dataclass(frozen=True)
class SearchOptions:
    """The search's SLO, check window and budget; `price_per_gpu_hour` prices a worker (1: cost in GPU-hours)."""

    slo: Slo
    window_s: float = 30.0
    warmup_s: float = DEFAULT_WARMUP_S
    seed: int = 12345
    max_checks: int = DEFAULT_MAX_CHECKS
    max_search_s: float = DEFAULT_MAX_SEARCH_S
    max_checks_per_level: int = DEFAULT_MAX_CHECKS_PER_LEVEL
    price_per_gpu_hour: float = 1.0


@dataclass(frozen=True)
class Checked:
    """A candidate and its twin check."""

    candidate: Candidate
    outcome: CheckOutcome


@dataclass
class SearchResult:
    """The chosen plan (None: none met the SLO within the budget), every check, and the prune counts."""

    options: SearchOptions
    checks: list[Checked]
    chosen: Checked | None
    pruned: dict[str, int]
    num_candidates: int
    search_s: float
    is_budget_exhausted: bool
    is_window_empty: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """MEETS when a plan was chosen; NOT_JUDGED when the window holds no request; else a miss."""
        if self.chosen is not None:
            return MEETS
        if self.is_window_empty or (
            self.checks and all(c.outcome.verdict == NOT_JUDGED for c in self.checks)
        ):
            return NOT_JUDGED
        return "no plan meets the SLO"

    def cost(self, candidate: Candidate) -> float:
        """The candidate's price per hour."""
        return candidate.num_workers * self.options.price_per_gpu_hour

    def why_lost(self, checked: Checked) -> str:
        """Why a checked candidate is not the chosen one."""
        outcome = checked.outcome
        if outcome.verdict == NOT_JUDGED:
            return "could not judge: no request in the check window"
        if outcome.verdict != MEETS:
            if outcome.num_refused:
                return f"{outcome.num_refused} requests refused at the front door"
            return f"{outcome.slo.metric} {outcome.measured_s:.3f} s over the SLO's {outcome.slo.max_s:g} s"
        assert self.chosen is not None
        if checked.candidate.num_workers > self.chosen.candidate.num_workers:
            return f"costlier ({self.cost(checked.candidate):g} vs {self.cost(self.chosen.candidate):g} per hour)"
        return "met the SLO with less margin at the same cost"

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON): the chosen plan and the runners-up, each with its check and margin."""
        runners_up = [c for c in self.checks if c is not self.chosen]
        return {
            "slo": str(self.options.slo),
            "verdict": self.verdict,
            "chosen": None if self.chosen is None else self._row(self.chosen),
            "runners_up": [self._row(c) | {"why": self.why_lost(c)} for c in runners_up],
            "num_checks": len(self.checks),
            "max_checks": self.options.max_checks,
            "search_s": round(self.search_s, 3),
            "max_search_s": self.options.max_search_s,
            "is_budget_exhausted": self.is_budget_exhausted,
            "num_candidates": self.num_candidates,
            "pruned": self.pruned,
            "window_s": self.options.window_s,
            "warmup_s": self.options.warmup_s,
            "price_per_gpu_hour": self.options.price_per_gpu_hour,
            "notes": self.notes,
        }

    def _row(self, checked: Checked) -> dict[str, Any]:
        return (
            checked.candidate.as_dict()
            | {"cost_per_hour": self.cost(checked.candidate)}
            | checked.outcome.as_dict()
        )


class PlanSearch:
    """One search (module doc): `run()` once."""

    def __init__(
        self, workload: Workload, profile: TwinProfile, settings: Settings, options: SearchOptions
    ) -> None:
        self.workload, self.profile, self.settings, self.options = workload, profile, settings, options
        self.engine: EngineSettings = settings.engine
        self.setups = setups(self.engine, self._placement_policy())
        self.checks: list[Checked] = []
        self.pruned: dict[str, int] = {}
        self.num_candidates = 0
        self._seen_levels: set[int] = set()
        self._started = 0.0
        self.notes: list[str] = []

    def run(self) -> SearchResult:
        """Search (module doc)."""
        self._started = time.perf_counter()
        options = self.options
        if window_requests(self.workload, options.window_s, options.warmup_s, options.seed) == 0:
            self.notes.append(
                f"the check window ({options.window_s:g} s) holds no request of the workload: lengthen it"
                " (--check-s) to judge a plan"
            )
            return self._result(None, is_window_empty=True)
        low = min_workers(self.profile, self.engine, self.workload, self.setups)
        if low > 1:
            self.notes.append(f"every candidate of fewer than {low} workers is past the estimated capacity")
        passed: dict[int, Checked] = {}
        failed = low - 1
        level, step = low, 1
        while level <= MAX_WORKERS and not passed and self._has_budget():
            found = self._check_level(level)
            if found is None and self._judged_nothing():
                return self._result(None)
            if found is not None:
                passed[level] = found
            else:
                failed, level, step = level, level + step, step * 2
        while passed and min(passed) - failed > 1 and self._has_budget():
            middle = (failed + min(passed)) // 2
            found = self._check_level(middle)
            if found is not None:
                passed[middle] = found
            else:
                failed = middle
        return self._result(passed[min(passed)] if passed else None)

    def _check_level(self, num_workers: int) -> Checked | None:
        """Check the level's best candidates (module doc, 2); the first that meets the SLO, or None."""
        for candidate in self._ordered(num_workers)[: self.options.max_checks_per_level]:
            if not self._has_budget():
                return None
            outcome = check_candidate(
                candidate, self.workload, self.profile, self.settings, self.options.slo,
                window_s=self.options.window_s, warmup_s=self.options.warmup_s, seed=self.options.seed,
            )  # fmt: skip
            checked = Checked(candidate, outcome)
            self.checks.append(checked)
            if outcome.verdict == MEETS:
                return checked
            if outcome.verdict == NOT_JUDGED:
                return None
        return None

    def _ordered(self, num_workers: int) -> list[Candidate]:
        """The level's unpruned candidates: the reference, its one-change variants, the rest (lowest load first)."""
        reference = reference_setup(self.engine, self._placement_policy())
        kept: list[tuple[int, float, Candidate]] = []
        for setup in self.setups:
            if num_workers == 1 and setup[4] != reference[4]:
                self._count("one worker: placement has no choice", num_workers)
                continue
            candidate = Candidate(num_workers, *setup)
            guess = estimate(candidate, self.profile, self.engine, self.workload)
            if guess.pruned:
                self._count(guess.pruned, num_workers)
                continue
            num_changes = sum(a != b for a, b in zip(setup, reference, strict=True))
            kept.append((min(num_changes, 2), guess.load, candidate))
        self._seen_levels.add(num_workers)
        return [c for _, _, c in sorted(kept, key=lambda k: (k[0], k[1]))]

    def _count(self, reason: str, num_workers: int) -> None:
        if num_workers not in self._seen_levels:
            self.pruned[reason] = self.pruned.get(reason, 0) + 1

    def _has_budget(self) -> bool:
        elapsed = time.perf_counter() - self._started
        return len(self.checks) < self.options.max_checks and elapsed < self.options.max_search_s

    def _judged_nothing(self) -> bool:
        return bool(self.checks) and all(c.outcome.verdict == NOT_JUDGED for c in self.checks)

    def _placement_policy(self) -> str:
        return self.settings.placement.policy if self.settings.jobs.placement_interval_s > 0 else NO_PLACEMENT

    def _result(self, chosen: Checked | None, *, is_window_empty: bool = False) -> SearchResult:
        if chosen is not None:  # the best margin among the passing checks at the chosen cost
            same = [
                c for c in self.checks
                if c.outcome.verdict == MEETS and c.candidate.num_workers == chosen.candidate.num_workers
            ]  # fmt: skip
            chosen = max(same, key=lambda c: c.outcome.margin_pct or 0.0)
        exhausted = not self._has_budget()
        if exhausted:
            self.notes.append(
                f"search budget spent ({len(self.checks)} of {self.options.max_checks} twin checks, "
                f"{time.perf_counter() - self._started:.0f} of {self.options.max_search_s:g} s)"
            )
        self.num_candidates = len(self.setups) * max(len(self._seen_levels), 1)
        return SearchResult(
            self.options, self.checks, chosen, dict(self.pruned), self.num_candidates,
            time.perf_counter() - self._started, exhausted, is_window_empty, self.notes,
        )  # fmt: skip


def search_plans(
    workload: Workload, profile: TwinProfile, settings: Settings, options: SearchOptions
) -> SearchResult:
    """The cheapest candidate that meets `options.slo` in the cluster twin, within the budget (module doc)."""
    return PlanSearch(workload, profile, settings, options).run()
