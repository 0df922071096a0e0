"""`lorahost plan`: how many GPUs, which adapters on each and how big each adapter cache, for a workload.

    lorahost plan WORKLOAD.yaml [--profile NAME|PATH] [--slo ttft_p99=2s] [--objective throughput|latency]
                  [--baselines] [--json] [--no-search] [--max-checks N] [--max-search-s S] [--gpu-price P]

The surrogate (twin/planner/) is trained on twin runs of one worker with the profile and this
deployment's engine settings, cached under --cache-dir (first run: a few minutes; later runs: a refit). Every
plan printed was re-run in the twin, GPU by GPU; the exit status is 1 when the twin check still fails.
With an SLO, the search (twin/planner/search.py) then chooses the cheapest deployment (workers, max_num_seqs,
memory mode and pool split, batch policy, placement) that meets it in the cluster twin, within --max-checks
twin checks and --max-search-s seconds, printed with its margin and the runners-up; the exit status is 1 when
it finds none or could not judge (no request in the check window).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer


def plan(
    workload_path: Annotated[
        Path, typer.Argument(help="Workload file (YAML or JSON), see docs/examples/plan-workload.yaml")
    ],
    profile: Annotated[
        str | None,
        typer.Option(
            help="Twin profile: a shipped name or a file (default LORAHOST_PLACEMENT_PLANNER_PROFILE)"
        ),
    ] = None,
    slo: Annotated[str | None, typer.Option(help="Latency SLO, e.g. ttft_p99=2s")] = None,
    objective: Annotated[
        str, typer.Option(help="throughput (fewest GPUs) or latency (load spread)")
    ] = "throughput",
    form: Annotated[str, typer.Option(help="Surrogate: forest or tree")] = "forest",
    samples: Annotated[int, typer.Option(help="Twin training runs of the surrogate")] = 150,
    check_s: Annotated[float, typer.Option(help="Simulated seconds of the twin check per GPU")] = 30.0,
    cache_dir: Annotated[Path | None, typer.Option(help="Training cache (default DATA_DIR/planner)")] = None,
    baselines: Annotated[
        bool, typer.Option(help="Also place with MaxBase and Random and check them")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables")] = False,
    search: Annotated[
        bool, typer.Option(help="With --slo: search the cheapest deployment meeting it in the cluster twin")
    ] = True,
    max_checks: Annotated[
        int | None,
        typer.Option(
            help="Search budget: twin checks (default LORAHOST_PLACEMENT_PLANNER_SEARCH_MAX_CHECKS)"
        ),
    ] = None,
    max_search_s: Annotated[
        float | None,
        typer.Option(help="Search budget: wall seconds (default LORAHOST_PLACEMENT_PLANNER_SEARCH_MAX_S)"),
    ] = None,
    gpu_price: Annotated[float, typer.Option(help="A worker's price per hour (the search's cost)")] = 1.0,
) -> None:
    """Plan GPUs, adapter placement and adapter caches for a workload, checked in the digital twin."""
    from settings import Settings
    from twin.planner.plan import PlanOptions
    from twin.planner.profile_lookup import resolve_profile
    from twin.planner.run_planner import plan_workload
    from twin.planner.search import SearchOptions
    from twin.planner.slo import parse_slo
    from twin.planner.surrogate import TrainingConfig
    from twin.planner.workload import WorkloadError, load_workload
    from twin.profile import ProfileError

    settings = Settings()
    try:
        workload = load_workload(workload_path)
        twin_profile = resolve_profile(profile or settings.placement.planner_profile)
        parsed_slo = parse_slo(slo) if slo else None
    except (WorkloadError, ProfileError, ValueError) as exc:
        typer.echo(f"lorahost plan: {exc}", err=True)
        raise typer.Exit(2) from None
    if objective not in ("throughput", "latency") or form not in ("forest", "tree"):
        typer.echo("lorahost plan: --objective is throughput or latency; --form is forest or tree", err=True)
        raise typer.Exit(2)
    options = PlanOptions(
        slo=parsed_slo, objective=objective, form=form,  # type: ignore[arg-type]
        check_duration_s=check_s, max_lora_rank=settings.resolved_max_lora_rank(),
    )  # fmt: skip
    placement = settings.placement
    num_checks = placement.planner_search_max_checks if max_checks is None else max_checks
    search_options = (
        SearchOptions(
            parsed_slo,
            window_s=check_s,
            max_checks=num_checks,
            price_per_gpu_hour=gpu_price,
            max_search_s=placement.planner_search_max_s if max_search_s is None else max_search_s,
        )
        if search and parsed_slo is not None and num_checks > 0
        else None
    )
    report = plan_workload(
        workload,
        twin_profile,
        settings.engine,
        options,
        training=TrainingConfig(num_samples=samples),
        cache_dir=cache_dir or settings.placement.planner_cache_dir or settings.data_dir / "planner",
        with_baselines=baselines,
        progress=None if as_json else _progress,
        search=search_options,
        settings=settings,
    )
    typer.echo(json.dumps(report, indent=1) if as_json else _table(report))
    if "search" in report and not as_json:
        from lorahost.plan_search_view import search_table

        typer.echo(search_table(report["search"]))
    if not report["twin_ok"] or report.get("search", {}).get("verdict", "meets SLO") != "meets SLO":
        raise typer.Exit(1)


def _progress(done: int, total: int) -> None:
    if done == 1 or done % 25 == 0 or done == total:
        typer.echo(f"training the surrogate in the twin: {done}/{total} runs", err=True)


def _check_word(report: dict[str, Any]) -> str:
    if report["verdict"] == "could not judge":
        return "COULD NOT JUDGE (no request in the check window: raise --check-s)"
    return "OK" if report["twin_ok"] else "FAILED"


def _margin(report: dict[str, Any]) -> str:
    margin = report.get("margin_pct")
    return "" if margin is None else f", margin {margin:+.1f}% under the SLO"


def _table(report: dict[str, Any]) -> str:
    lines = [
        (f"profile: {report['profile']}   objective: {report['objective']}   SLO: {report['slo'] or 'none'}"),
        (
            f"GPUs needed: {report['num_gpus']}   twin check: {_check_word(report)}{_margin(report)}"
            f" (rounds {report['num_rounds']}, plan {report['plan_s']:.2f} s, twin {report['check_s']:.1f} s)"
        ),
        (
            f"throughput tok/s: predicted {report['predicted_throughput_tok_s']:.0f}, twin {report['twin_throughput_tok_s']:.0f}"
            f" (offered {report['twin_offered_tok_s']:.0f});  TTFT p99 s: predicted {report['predicted_ttft_p99_s']:.3f},"
            f" twin {report['twin_ttft_p99_s']:.3f}"
        ),
        "",
        (
            f"{'gpu':>3} {'adapters':>8} {'req/s':>7} {'cache':>10} {'slots':>5} {'pred tok/s':>10} {'twin tok/s':>10}"
            f" {'pred ttft99':>11} {'twin ttft99':>11} {'twin':>8}  adapters"
        ),
    ]
    for i, gpu in enumerate(report["gpus"]):
        pred, twin = gpu["predicted"] or {}, gpu["twin"] or {}
        names = [a["adapter_id"] for a in gpu["adapters"]]
        shown = ", ".join(names[:6]) + (f", ... (+{len(names) - 6})" if len(names) > 6 else "")
        state = (
            "overflow" if twin.get("is_memory_overflow") else "starved" if twin.get("is_starved") else "ok"
        )
        lines.append(
            f"{i:>3} {len(names):>8} {gpu['total_rate']:>7.2f} {gpu['cache_bytes'] / 2**30:>8.2f}Gi"
            f" {gpu['num_cache_slots']:>5} {pred.get('throughput_tok_s', float('nan')):>10.0f}"
            f" {twin.get('throughput_tok_s', float('nan')):>10.0f} {pred.get('ttft_p99_s', float('nan')):>11.3f}"
            f" {twin.get('ttft_p99_s', float('nan')):>11.3f} {state:>8}  {shown}"
        )
    for b in report.get("baselines", []):
        lines.append(
            f"baseline {b['name']}: {b['num_gpus']} GPUs, twin: {b['num_starved_gpus']} starved, "
            f"{b['num_overflow_gpus']} overflow, {b['num_slo_missed_gpus']} over the SLO"
        )
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)
