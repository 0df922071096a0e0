from prometheus_client.parser import text_string_to_metric_families

from api.metrics import ApiMetrics
from registry.membership import WorkerRecord


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
    record = WorkerRecord("w1", "http://x", "base", num_running=2, num_waiting=3,
                          device_adapters=("a", "b"), host_adapters=("c",), extra={"num_cache_hits": 7})
    samples = _samples(ApiMetrics(lambda: [record]).render())
    assert samples[("lorahost_worker_queue_depth", (("worker", "w1"),))] == 3
    assert samples[("lorahost_worker_resident_adapters", (("tier", "device"), ("worker", "w1")))] == 2
    assert samples[("lorahost_worker_resident_adapters", (("tier", "host"), ("worker", "w1")))] == 1
    assert samples[("lorahost_worker_adapter_cache_hits_total", (("worker", "w1"),))] == 7
