"""Chameleon's non-preemptive multi-queue scheduler (engine_batch_policy="multiqueue"), pure.

- `multiqueue.py`: the `BatchPolicy` and its sliding window of recent requests;
- `request_size.py`: the weighted request size (size classes) and the need in KV tokens (quotas);
- `queue_clustering.py`: exact 1-D K-means over recent sizes, the K selection, the cut-offs between classes;
- `queue_quotas.py`: per-queue token quotas (K x M/M/1 for the TTFT SLO, the rest by demand);
- `queue_admission.py`: two-phase admission under the quotas, the progress rule and the adapter bypass.
"""
