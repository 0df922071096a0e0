"""Timing CPU-assisted prefills for the digital twin's host term (`lorahost profile --twin-output`).

A cold adapter's prefill runs while its copy is under way, its LoRA delta computed from the host copy by the
engine's CPU prefill workers (gpu_workers/engine/layers/host_lora.py). The grid's steps never have one (their
adapters are resident), so this pass makes them on purpose: per repeat, rank and prompt length, a fresh id
of the grid's adapter of that rank is registered (host only), the copy link is slowed for its load so the
copy lands `HOLD_SECONDS` after it starts (the prefill is host-assisted whatever the machine copies), every
layer of the step takes the host copy (`host_switch_layer`, no switch to the device copy mid-step), and one
request's prefill step is timed with the grid timer's recorder; then the request is aborted, the copy lands
and the adapter is dropped again. The link and the switch are restored after the pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_workers.engine.grid_timer import (
    StepRecorder,
    TimedStep,
    abort_grid_requests,
    add_grid_request,
    grid_params,
)

if TYPE_CHECKING:
    from gpu_workers.engine.profile_grid import ProfileGrid

HOLD_SECONDS = 0.25  # how long after it starts a held copy lands (longer than preparing -> scheduling)
MAX_STEPS = 200  # engine steps to wait for the prepared host copy before giving up on a sample


def time_host_prefills(engine: Any, grid: ProfileGrid, adapter_dirs: dict[int, Path]) -> list[TimedStep]:
    """One timed host-assisted prefill step per repeat x rank x prompt length (module doc); each has the
    host-assisted entry in `shape.host_token_ranks`. ValueError when a step never became host-assisted."""
    copier, runner = engine.runner.transfers.copier, engine.runner
    link_gbps, switch_layer = copier.link_gbps, runner.host_switch_layer
    ranks: dict[str, int] = {}
    recorder = StepRecorder(engine, ranks)
    runner.host_switch_layer = runner.args.num_layers
    timed: list[TimedStep] = []
    try:
        for repeat in range(grid.num_repeats):
            for rank in sorted(grid.ranks):
                for num_tokens in grid.prompt_tokens:
                    adapter_id = f"host-prefill-{rank}-{num_tokens}-{repeat}"
                    ranks[adapter_id] = rank
                    timed.append(
                        _timed_host_prefill(
                            engine, recorder, grid, adapter_id, adapter_dirs[rank], num_tokens
                        )
                    )
    finally:
        recorder.close()
        copier.link_gbps = link_gbps
        runner.host_switch_layer = switch_layer
    return timed


def _timed_host_prefill(
    engine: Any, recorder: StepRecorder, grid: ProfileGrid, adapter_id: str, path: Path, num_tokens: int
) -> TimedStep:
    """Register `adapter_id` cold, hold its copy, time its request's host-assisted prefill step, clean up."""
    engine.register_adapter(adapter_id, path)
    num_bytes = engine.residency.get(adapter_id).num_bytes
    engine.runner.transfers.copier.link_gbps = num_bytes / HOLD_SECONDS / 1e9
    request_id = add_grid_request(engine, grid_params(grid), adapter_id, num_tokens, 0)
    found = None
    for _ in range(MAX_STEPS):
        step = recorder.timed_step()
        if step.shape.host_token_ranks:
            found = step
            break
    abort_grid_requests(engine, [request_id])
    while engine.adapter_residency(adapter_id) != "device":  # the held copy lands within HOLD_SECONDS
        engine.runner.transfers.copier.wait_any(HOLD_SECONDS)
        engine.step()
        if engine.adapter_residency(adapter_id) in ("host", "none"):  # dropped before it landed
            break
    if engine.adapter_residency(adapter_id) == "device":
        engine.unload_adapter(adapter_id)
    if found is None:
        raise ValueError(f"no host-assisted prefill step of {adapter_id} within {MAX_STEPS} steps")
    return found
