from prometheus_client.parser import text_string_to_metric_families

from api.metrics import ApiMetrics
from cluster.membership import WorkerRecord
from cluster.protocol import EngineSummary
from scheduler.core.scheduler_stats import SchedulerStats


def _samples(text: bytes) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_count_requests_tokens_and_latencies() -> None:
    metrics = ApiMetrics()
    metrics.observe_request("ok", 10, 5, 120.0, 15.0, 200.0)
    metrics.observe_request("error", 3, 0, None, None, None)
    samples = _samples(metrics.render())
    assert samples[("lorahost_requests_total", (("status", "ok"),))] == 1
    assert samples[("lorahost_requests_total", (("status", "error"),))] == 1
    assert samples[("lorahost_tokens_total", (("kind", "prompt"),))] == 13
    assert samples[("lorahost_tokens_total", (("kind", "completion"),))] == 5
    assert samples[("lorahost_ttft_ms_count", ())] == 1


def test_worker_gauges_come_from_live_worker_records() -> None:
    record = WorkerRecord(
        "w1",
        "http://x",
        "base",
        host_adapters=("c",),
        num_cache_hits=7,
        scheduler=SchedulerStats(num_running=2, num_waiting=3, device_adapters=("a", "b")),
    )
    samples = _samples(ApiMetrics(lambda: [record]).render())
    assert samples[("lorahost_worker_queue_depth", (("worker", "w1"),))] == 3
    assert samples[("lorahost_worker_resident_adapters", (("tier", "device"), ("worker", "w1")))] == 2
    assert samples[("lorahost_worker_resident_adapters", (("tier", "host"), ("worker", "w1")))] == 1
    assert samples[("lorahost_worker_adapter_cache_hits_total", (("worker", "w1"),))] == 7


def test_worker_device_adapter_cache_counters_load_time_and_page_split_are_exported() -> None:
    record = WorkerRecord(
        "w1",
        "http://x",
        "base",
        scheduler=SchedulerStats(
            num_adapter_hits=9,
            num_adapter_misses=2,
            num_adapter_evictions=4,
            num_adapter_prefetches=3,
            num_timed_adapter_loads=5,
            adapter_load_seconds_total=0.5,
            num_kv_pages_used=10,
            num_adapter_pages=6,
            num_free_pool_pages=20,
            num_cpu_assisted_prefills=8,
            num_copy_waits=1,
        ),
    )
    samples = _samples(ApiMetrics(lambda: [record]).render())
    worker = (("worker", "w1"),)
    assert samples[("lorahost_worker_cpu_assisted_prefills_total", worker)] == 8
    assert samples[("lorahost_worker_adapter_copy_waits_total", worker)] == 1
    assert samples[("lorahost_worker_adapter_device_hits_total", worker)] == 9
    assert samples[("lorahost_worker_adapter_device_misses_total", worker)] == 2
    assert samples[("lorahost_worker_adapter_device_evictions_total", worker)] == 4
    assert samples[("lorahost_worker_adapter_device_prefetches_total", worker)] == 3
    assert samples[("lorahost_worker_adapter_load_seconds_count", worker)] == 5
    assert samples[("lorahost_worker_adapter_load_seconds_sum", worker)] == 0.5
    for use, value in (("kv", 10), ("adapter", 6), ("free", 20)):
        assert samples[("lorahost_worker_pool_pages", (("use", use), ("worker", "w1")))] == value


def test_each_workers_engine_and_its_requests_per_adapter_are_exported() -> None:
    native = WorkerRecord(
        "w1",
        "http://x",
        "base",
        scheduler=SchedulerStats(num_running_by_adapter={"a": 2}, num_waiting_by_adapter={"b": 1}),
    )
    vllm = WorkerRecord(
        "w2",
        "http://y",
        "base",
        engine=EngineSummary(backend="vllm"),
        scheduler=SchedulerStats(num_running_by_adapter={"b": 3}),
    )
    samples = _samples(ApiMetrics(lambda: [native, vllm]).render())
    for worker, engine in (("w1", "native"), ("w2", "vllm")):
        labels = (("base_model", "base"), ("engine", engine), ("worker", worker))
        assert samples[("lorahost_worker_info", labels)] == 1
    assert samples[("lorahost_worker_adapter_running_requests", (("adapter", "a"), ("worker", "w1")))] == 2
    assert samples[("lorahost_worker_adapter_queue_depth", (("adapter", "b"), ("worker", "w1")))] == 1
    assert samples[("lorahost_worker_adapter_running_requests", (("adapter", "b"), ("worker", "w2")))] == 3
    assert ("lorahost_worker_adapter_queue_depth", (("adapter", "b"), ("worker", "w2"))) not in samples


# ---- /metrics access (settings.api.metrics_token, settings.api.is_metrics_public) --------------------------------


def test_metrics_need_the_admin_key_by_default(client, tenant) -> None:
    from tests.api.conftest import ADMIN

    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=tenant.headers).status_code == 401
    refused = client.get("/metrics", headers={"Authorization": "Bearer wrong"})
    assert refused.status_code == 401 and "metrics" in refused.json()["error"]["message"]
    assert client.get("/metrics", headers=ADMIN).status_code == 200


def test_metrics_token_opens_metrics_and_nothing_else(make_client) -> None:
    from tests.api.conftest import ADMIN

    client = make_client(metrics_token="scrape-me")
    scraper = {"Authorization": "Bearer scrape-me"}
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=scraper).status_code == 200
    assert client.get("/metrics", headers=ADMIN).status_code == 200
    assert client.get("/v1/admin/tenants", headers=scraper).status_code == 401


def test_public_metrics_when_the_operator_opts_in(make_client) -> None:
    client = make_client(is_metrics_public=True)
    assert client.get("/metrics").status_code == 200
