"""Chameleon's non-preemptive multi-queue scheduler (engine_batch_policy="multiqueue"), pure, with two sizings.

- `multiqueue.py`: the `BatchPolicy`;
- `queue_sizing.py`: the two sizings (engine_multiqueue_sizing): "wrs" (Chameleon's) and "tokens" (the
  platform's: classes by tokens, held adapters charged once, quotas by measured demand, the age bound);
- `queue_window.py`: the sliding window of recent requests and what it measures (class loads, service time);
- `request_size.py`: the weighted request size (size classes) and the need in KV tokens (quotas);
- `queue_clustering.py`: exact 1-D K-means over recent sizes, the K selection, the cut-offs between classes;
- `queue_quotas.py`: per-queue token quotas (K x M/M/1 for the TTFT SLO, the rest by demand);
- `queue_admission.py`: two-phase admission under the quotas, aged requests first, the progress rule and the
  adapter bypass.
"""
