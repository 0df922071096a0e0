"""Prometheus metrics for the API process (its own registry: no import-time global state).

Request/token counters and latency histograms are updated by the completions route; queue depth and
adapter residency are read from the worker directory at scrape time (workers advertise them in heartbeats).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

from api.serving_heap import GcPauseCollector, ServingHeap
from cluster.membership import WorkerRecord

LATENCY_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
COLD_START_BUCKETS_S = (0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)
TPOT_BUCKETS_MS = (1, 2, 5, 10, 20, 35, 50, 75, 100, 150, 250, 500, 1000)
STAGE_BUCKETS_MS = (0.5, 1, 2, 5, 10, 20, 35, 50, 100, 200, 500, 1000, 5000)


class WorkerCollector(Collector):
    """Per-worker gauges taken from live worker records at scrape time."""

    def __init__(self, list_workers: Callable[[], Iterable[WorkerRecord]]) -> None:
        self._list_workers = list_workers

    def collect(self):  # type: ignore[no-untyped-def]
        """Yield each worker's base model and engine, queue depth and running requests (also per adapter), residency, host and device adapter cache counters, adapter load
        time and the page pool split per worker."""
        running = GaugeMetricFamily("lorahost_worker_running_requests", "Requests running", labels=["worker"])
        waiting = GaugeMetricFamily("lorahost_worker_queue_depth", "Requests waiting", labels=["worker"])
        resident = GaugeMetricFamily(
            "lorahost_worker_resident_adapters", "Adapters resident per tier", labels=["worker", "tier"]
        )
        hits = CounterMetricFamily(
            "lorahost_worker_adapter_cache_hits", "Adapter cache hits", labels=["worker"]
        )
        misses = CounterMetricFamily(
            "lorahost_worker_adapter_cache_misses", "Adapter cache misses", labels=["worker"]
        )
        loads = CounterMetricFamily("lorahost_worker_adapter_loads", "Adapter loads", labels=["worker"])
        device_cache = {
            name: CounterMetricFamily(f"lorahost_worker_adapter_device_{name}", text, labels=["worker"])
            for name, text in (
                ("hits", "Admissions whose adapter was already on the device"),
                ("misses", "Admissions that had to load their adapter to the device"),
                ("evictions", "Adapters evicted from the device"),
                ("prefetches", "Adapter loads planned for queued requests before admission"),
            )
        }
        cold = {
            name: CounterMetricFamily(f"lorahost_worker_{name}", text, labels=["worker"])
            for name, text in (
                ("cpu_assisted_prefills", "Prefills that ran on an adapter's host copy while it was copied"),
                ("adapter_copy_waits", "Requests that waited for their adapter's copy to the device"),
            )
        }
        load_seconds = SummaryMetricFamily(
            "lorahost_worker_adapter_load_seconds", "Host-to-device adapter load time", labels=["worker"]
        )
        pool_pages = GaugeMetricFamily(
            "lorahost_worker_pool_pages",
            "Device page pool pages by use (kv, adapter, free)",
            labels=["worker", "use"],
        )
        info = GaugeMetricFamily(
            "lorahost_worker_info",
            "1 per live worker: its base model and engine",
            labels=["worker", "base_model", "engine"],
        )
        adapter_running = GaugeMetricFamily(
            "lorahost_worker_adapter_running_requests",
            "Requests running per adapter",
            labels=["worker", "adapter"],
        )
        adapter_waiting = GaugeMetricFamily(
            "lorahost_worker_adapter_queue_depth",
            "Requests waiting per adapter",
            labels=["worker", "adapter"],
        )
        for w in self._list_workers():
            core = w.scheduler
            info.add_metric([w.worker_id, w.base_model, w.engine.backend], 1)
            for adapter, num in sorted(core.num_running_by_adapter.items()):
                adapter_running.add_metric([w.worker_id, adapter], num)
            for adapter, num in sorted(core.num_waiting_by_adapter.items()):
                adapter_waiting.add_metric([w.worker_id, adapter], num)
            running.add_metric([w.worker_id], core.num_running)
            waiting.add_metric([w.worker_id], core.num_waiting)
            resident.add_metric([w.worker_id, "device"], len(core.device_adapters))
            resident.add_metric([w.worker_id, "host"], len(w.host_adapters))
            hits.add_metric([w.worker_id], float(w.num_cache_hits))
            misses.add_metric([w.worker_id], float(w.num_cache_misses))
            loads.add_metric([w.worker_id], float(core.num_adapter_loads))
            device_cache["hits"].add_metric([w.worker_id], float(core.num_adapter_hits))
            device_cache["misses"].add_metric([w.worker_id], float(core.num_adapter_misses))
            device_cache["evictions"].add_metric([w.worker_id], float(core.num_adapter_evictions))
            device_cache["prefetches"].add_metric([w.worker_id], float(core.num_adapter_prefetches))
            cold["cpu_assisted_prefills"].add_metric([w.worker_id], float(core.num_cpu_assisted_prefills))
            cold["adapter_copy_waits"].add_metric([w.worker_id], float(core.num_copy_waits))
            load_seconds.add_metric(
                [w.worker_id], core.num_timed_adapter_loads, core.adapter_load_seconds_total
            )
            pool_pages.add_metric([w.worker_id, "kv"], core.num_kv_pages_used)
            pool_pages.add_metric([w.worker_id, "adapter"], core.num_adapter_pages)
            pool_pages.add_metric([w.worker_id, "free"], core.num_free_pool_pages)
        yield from (
            info,
            running,
            waiting,
            adapter_running,
            adapter_waiting,
            resident,
            hits,
            misses,
            loads,
            *device_cache.values(),
            *cold.values(),
            load_seconds,
            pool_pages,
        )


class DesiredWorkersCollector(Collector):
    """lorahost_desired_workers{base_model}: the autoscaling decision (api/scaling_view.py) at scrape time."""

    def __init__(self, desired_workers: Callable[[], Iterable[tuple[str, int]]]) -> None:
        self._desired_workers = desired_workers

    def collect(self):  # type: ignore[no-untyped-def]
        """Yield the desired worker count per base model."""
        gauge = GaugeMetricFamily(
            "lorahost_desired_workers",
            "Workers the autoscaler should run per base model",
            labels=["base_model"],
        )
        for base_model, num_workers in self._desired_workers():
            gauge.add_metric([base_model], num_workers)
        yield gauge


class ApiMetrics:
    """The API's metrics, registered in a registry owned by this object."""

    def __init__(self, list_workers: Callable[[], Iterable[WorkerRecord]] | None = None) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "lorahost_requests", "Inference requests by final status", ["status"], registry=self.registry
        )
        self.tokens = Counter("lorahost_tokens", "Tokens metered by kind", ["kind"], registry=self.registry)
        self.ttft_ms = Histogram(
            "lorahost_ttft_ms", "Time to first token (ms)", buckets=LATENCY_BUCKETS_MS, registry=self.registry
        )
        self.tpot_ms = Histogram(
            "lorahost_tpot_ms",
            "Mean time per output token (ms)",
            buckets=TPOT_BUCKETS_MS,
            registry=self.registry,
        )
        self.e2e_ms = Histogram(
            "lorahost_e2e_ms", "End-to-end latency (ms)", buckets=LATENCY_BUCKETS_MS, registry=self.registry
        )
        self.stage_ms = Histogram(
            "lorahost_request_stage_ms",
            "Time of each stage of a request before its first token (api/request_meter.py REQUEST_STAGES; ms)",
            ["stage"],
            buckets=STAGE_BUCKETS_MS,
            registry=self.registry,
        )
        # the labelled children of the per-request metrics, looked up once (labels() validates and locks: ~3 us)
        self._requests_by_status: dict[str, Counter] = {}
        self._stage_by_name: dict[str, Histogram] = {}
        self._prompt_tokens = self.tokens.labels(kind="prompt")
        self._completion_tokens = self.tokens.labels(kind="completion")
        self.loop_lag_ms = Histogram(
            "lorahost_event_loop_lag_ms",
            "How late the event loop ran a timer (ms; api/loop_lag.py): the delay every request shares then",
            buckets=STAGE_BUCKETS_MS,
            registry=self.registry,
        )
        self.cold_start_wait_s = Histogram(
            "lorahost_cold_start_wait_seconds",
            "How long requests waited for a ready worker of their base model (only requests that waited)",
            ["base_model"],
            buckets=COLD_START_BUCKETS_S,
            registry=self.registry,
        )
        self.cold_start_waiting = Gauge(
            "lorahost_cold_start_waiting_requests",
            "Requests waiting now for a ready worker of their base model (demand for a scale-up from zero)",
            ["base_model"],
            registry=self.registry,
        )
        if list_workers is not None:
            self.registry.register(WorkerCollector(list_workers))

    def register_desired_workers(self, desired_workers: Callable[[], Iterable[tuple[str, int]]]) -> None:
        """Export lorahost_desired_workers from `desired_workers()` ((base model, workers) pairs) at scrape time."""
        self.registry.register(DesiredWorkersCollector(desired_workers))

    def register_gc_pauses(self, heap: ServingHeap) -> None:
        """Export lorahost_gc_pause_ms from the process's ServingHeap at scrape time."""
        self.registry.register(GcPauseCollector(heap))

    def observe_request(
        self,
        status: str,
        prompt_tokens: int,
        completion_tokens: int,
        ttft_ms: float | None,
        tpot_ms: float | None,
        e2e_ms: float | None,
    ) -> None:
        """Count one finished request (call exactly once per request, next to the usage record)."""
        requests = self._requests_by_status.get(status)
        if requests is None:
            requests = self._requests_by_status[status] = self.requests.labels(status=status)
        requests.inc()
        self._prompt_tokens.inc(prompt_tokens)
        self._completion_tokens.inc(completion_tokens)
        for histogram, value in ((self.ttft_ms, ttft_ms), (self.tpot_ms, tpot_ms), (self.e2e_ms, e2e_ms)):
            if value is not None:
                histogram.observe(value)

    def observe_stages(self, stage_ms: dict[str, float]) -> None:
        """Observe how long each stage of one request took before its first token (stage -> ms)."""
        for stage, value in stage_ms.items():
            histogram = self._stage_by_name.get(stage)
            if histogram is None:
                histogram = self._stage_by_name[stage] = self.stage_ms.labels(stage=stage)
            histogram.observe(value)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
