"""One capacity plan in a child process: out of the caller's GIL, at low CPU priority, killable.

`run_plan_process` spawns a child (the `spawn` start method: nothing of a threaded parent is inherited), which
lowers its own priority (os.nice, so API requests win the CPU on a small box), runs
twin/planner/plan_inputs.run_plan_inputs and sends the answer back over a pipe. The parent waits on
the pipe and the child's sentinel, and kills the child when `should_stop()` turns true (cancellation,
shutdown) or the time limit passes. The child also exits by itself when its parent dies (it watches its
parent's pid), so no plan outlives the process that asked for it.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from settings.engine import EngineSettings

CHILD_NICE = 10  # added to the child's niceness: the API's threads come first on a busy CPU
POLL_S = 0.2  # how often the parent looks at should_stop while the child runs
PARENT_WATCH_S = 1.0  # how often the child checks that its parent still lives


@dataclass(frozen=True)
class PlanOutcome:
    """How a plan run ended: status succeeded | failed | cancelled, with the plan or the reason."""

    status: str
    result: dict[str, Any] | None = None
    error: str | None = None


def run_plan_process(
    inputs: dict[str, Any],
    engine: EngineSettings,
    cache_dir: Path,
    time_limit_s: float,
    should_stop: Callable[[], bool],
    on_start: Callable[[int], None] | None = None,
) -> PlanOutcome:
    """Run the plan in a child process and wait for it (module doc); `on_start` gets the child's pid."""
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(
        target=_child_main, args=(sender, inputs, engine, str(cache_dir), os.getpid()), daemon=True
    )
    child.start()
    sender.close()
    if on_start is not None and child.pid is not None:
        on_start(child.pid)
    try:
        return _wait_for_child(child, receiver, time.monotonic() + time_limit_s, time_limit_s, should_stop)
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        receiver.close()


def _wait_for_child(
    child: Any, receiver: Connection, deadline: float, time_limit_s: float, should_stop: Callable[[], bool]
) -> PlanOutcome:
    while True:
        ready = wait([receiver, child.sentinel], timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
        if receiver in ready:
            return _read_answer(receiver)
        if child.sentinel in ready:
            return PlanOutcome(
                "failed", error=f"the planner's process ended without an answer ({child.exitcode})"
            )
        if should_stop():
            return PlanOutcome("cancelled", error="cancelled")
        if time.monotonic() >= deadline:
            return PlanOutcome(
                "failed",
                error=f"the plan ran past the time limit of {time_limit_s:g} s "
                "(LORAHOST_PLACEMENT_PLANNER_TIME_LIMIT_S): plan a shorter check_s, fewer num_samples or "
                "a smaller workload, or ask the operator for a longer limit",
            )


def _read_answer(receiver: Connection) -> PlanOutcome:
    try:
        kind, value = receiver.recv()
    except EOFError:
        return PlanOutcome("failed", error="the planner's process ended without an answer")
    if kind == "ok":
        return PlanOutcome("succeeded", result=value)
    return PlanOutcome("failed", error=value)


def _child_main(
    sender: Connection, inputs: dict[str, Any], engine: EngineSettings, cache_dir: str, parent_pid: int
) -> None:
    """The child: low priority, exit with the parent, plan, send ("ok", plan) or ("error", reason)."""
    os.nice(CHILD_NICE)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    from twin.planner.plan_inputs import run_plan_inputs

    try:
        answer: tuple[str, Any] = ("ok", run_plan_inputs(inputs, engine, Path(cache_dir)))
    except Exception as exc:  # noqa: BLE001 - any failure goes back to the job row; the admin reads it
        answer = ("error", f"the planner failed: {type(exc).__name__}: {exc}")
    sender.send(answer)
    sender.close()


def _exit_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_WATCH_S)
    os._exit(1)
