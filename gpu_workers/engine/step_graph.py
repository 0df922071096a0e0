"""Recording a step once and running it again on new inputs: the capture / replay mechanism behind captured decode
steps (gpu_workers/engine/decode_graphs.py), behind one small interface so that CPU tests check what matters.

A step function handed to `StepGraph.capture` reads every per-step value from static buffers (tensors allocated
once, at fixed addresses, copied into before each replay) and returns its output tensor. Two implementations:
- `CudaStepGraphs`: torch.cuda.CUDAGraph, every graph in one shared memory pool (capture the largest batch first:
  the smaller ones reuse its memory); a replay relaunches the recorded kernels, which read the static buffers
  wherever the step read them while recording;
- `EagerReplayGraphs` (CPU, tests): a replay runs the captured function again, on the same static buffers. It
  checks the invariant a CUDA graph relies on: a step that read anything else (a Python list of this step's
  adapters, a tensor built from the batch at capture time) would give the capture-time answer at replay, and the
  tests comparing replays with eager steps would see it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

StepFn = Callable[[], torch.Tensor]
NUM_WARMUP_RUNS = (
    2  # before recording: the allocator's and the kernels' first-call work (Triton compiles) stay out
)


class StepGraph(Protocol):
    """One recorded step."""

    def capture(self, fn: StepFn) -> torch.Tensor:
        """Record `fn` (reading only static buffers) -> its output tensor (the one replay writes)."""
        ...

    def replay(self) -> torch.Tensor:
        """Run the recorded step on what the static buffers hold now -> its output tensor."""
        ...


class StepGraphs(Protocol):
    """Makes the graphs of one engine, which share memory."""

    def new_graph(self) -> StepGraph:
        """An empty graph (capture it next)."""
        ...

    def pool_bytes(self) -> int:
        """Device bytes the graphs' memory holds (0 where nothing is kept)."""
        ...


class CudaStepGraph:
    """A step recorded in a torch.cuda.CUDAGraph within its owner's memory pool."""

    def __init__(self, owner: CudaStepGraphs) -> None:
        self.owner = owner
        self.graph = torch.cuda.CUDAGraph()
        self.output: torch.Tensor | None = None

    def capture(self, fn: StepFn) -> torch.Tensor:
        """Warm `fn` up on a side stream, then record it into the shared pool."""
        stream = self.owner.stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(NUM_WARMUP_RUNS):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(self.graph, pool=self.owner.pool, stream=stream):
            self.output = fn()
        return self.output

    def replay(self) -> torch.Tensor:
        """Relaunch the recorded kernels."""
        assert self.output is not None, "capture before replay"
        self.graph.replay()
        return self.output


class CudaStepGraphs:
    """CUDA graphs of one device sharing one memory pool."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)
        self._reserved_before = torch.cuda.memory_reserved(device)

    def new_graph(self) -> CudaStepGraph:
        """An empty graph in the shared pool."""
        return CudaStepGraph(self)

    def pool_bytes(self) -> int:
        """Device memory the caching allocator reserved since these graphs began (their pool and outputs)."""
        return max(0, torch.cuda.memory_reserved(self.device) - self._reserved_before)


class EagerReplayGraph:
    """A 'recording' that is the function itself: replay calls it again (CPU; see the module doc)."""

    def __init__(self) -> None:
        self.fn: StepFn | None = None

    def capture(self, fn: StepFn) -> torch.Tensor:
        """Keep `fn` and run it once."""
        self.fn = fn
        return fn()

    def replay(self) -> torch.Tensor:
        """Run the kept function again on the static buffers."""
        assert self.fn is not None, "capture before replay"
        return self.fn()


class EagerReplayGraphs:
    """Eager-replay graphs (CPU tests); they keep no memory of their own."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def new_graph(self) -> EagerReplayGraph:
        """An empty eager-replay graph."""
        return EagerReplayGraph()

    def pool_bytes(self) -> int:
        """Nothing is kept between replays."""
        return 0


StepGraphsFactory = Callable[[torch.device], StepGraphs]
