"""gpu_workers/worker/backend.py: the stream signature is written once; every backend takes one EngineRequest."""

from __future__ import annotations

import inspect

import pytest

from gpu_workers.engine.async_engine import AsyncLLMEngine
from gpu_workers.worker.backend import InferenceBackend
from gpu_workers.worker.vllm_backend import VllmBackend


@pytest.mark.parametrize("backend", [AsyncLLMEngine, VllmBackend])
def test_each_backend_streams_from_the_one_request_struct(backend: type) -> None:
    expected = inspect.signature(InferenceBackend.generate_stream, eval_str=True)
    assert list(expected.parameters) == ["self", "request"]
    assert inspect.signature(backend.generate_stream, eval_str=True).parameters == expected.parameters
