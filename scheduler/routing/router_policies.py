"""The routing policies by name: the table settings.routing.policy picks from, and `make_router`.

Every policy is listed here explicitly (no module registers itself when imported). A new policy is a class
with `choose` (the `Router` protocol, scheduler/routing/router.py) plus one entry in `ROUTER_POLICIES`; a policy with
options (`RouterOptions`, built from settings) has a `from_options(options)` classmethod, the others are
constructed without arguments.
"""

from __future__ import annotations

from typing import Any

from scheduler.routing.caraserve_router import RankAwareRouter
from scheduler.routing.holder_router import HoldersLeastLoaded
from scheduler.routing.router import PlacementWeightedRandom, ResidencyThenLeastLoaded, Router, RouterOptions

ROUTER_POLICIES: dict[str, type[Any]] = {
    "residency_least_loaded": ResidencyThenLeastLoaded,
    "placement_weighted": PlacementWeightedRandom,
    "rank_aware": RankAwareRouter,
    "holders_least_loaded": HoldersLeastLoaded,
}
DEFAULT_ROUTER_POLICY = "holders_least_loaded"  # = settings/api.py DEFAULT_ROUTER_POLICY


def make_router(policy: str = DEFAULT_ROUTER_POLICY, options: RouterOptions | None = None) -> Router:
    """The routing policy named `policy` (a key of ROUTER_POLICIES); ValueError naming the choices
    otherwise."""
    try:
        cls = ROUTER_POLICIES[policy]
    except KeyError:
        raise ValueError(
            f"unknown router policy {policy!r}; choose one of {', '.join(sorted(ROUTER_POLICIES))}"
        ) from None
    from_options = getattr(cls, "from_options", None)
    router: Router = from_options(options or RouterOptions()) if from_options is not None else cls()
    return router
