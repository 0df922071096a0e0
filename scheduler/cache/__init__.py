"""The adapter cache's eviction order (Chameleon's and FastLibra's policies, LRU the baseline), pure.

- `eviction.py`: `EVICTION_POLICIES` (`adapter_eviction_policy`: lru, chameleon, fastlibra); the residency that
  applies them is scheduler/core/adapter_residency.py.
"""
