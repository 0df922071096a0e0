"""Routing: which worker serves a request (pure: plain data in, a decision out).

- `router.py`: the `Router` protocol, `WorkerView` and `RouteRequest`, the default (residency, then the tenant's
  load) and LoRAServe's placement-weighted draw;
- `router_policies.py`: the policies by name (`settings.routing.policy`) and `make_router`;
- `holder_router.py`: `holders_least_loaded`, the least-loaded holder of a replicated adapter, yielding to load;
- `caraserve_router.py`: CaraServe's rank-aware routing (policy name `rank_aware`): the least added per-token cost;
- `perf_model.py`: CaraServe's per-worker latency models against batch size and LoRA rank (`lorahost profile`).
"""
