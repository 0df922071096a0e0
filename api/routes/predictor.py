"""/v1/admin/predictor: the output-length predictor this API process serves and how accurate the recorded
predictions were (admin key only). The work: api/actions/predictor.py."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from api.actions import predictor
from api.actions.predictor import DEFAULT_WINDOW_S
from api.deps import AdminDep, ServicesDep, SessionDep
from api.query_dates import parse_moment
from api.report_schemas import PredictorReport
from api.request_text import TextCheckedRoute

router = APIRouter(prefix="/v1/admin", tags=["admin"], route_class=TextCheckedRoute)


@router.get("/predictor", response_model=PredictorReport)
async def get_predictor(
    _: AdminDep,
    session: SessionDep,
    services: ServicesDep,
    window_s: float = DEFAULT_WINDOW_S,
    end: str | None = None,
) -> PredictorReport:
    """The served model (version or "prior", trained_at, held-out metrics of its training) and, from the usage
    rows of requests that finished `ok` and started in the `window_s` seconds (default one day) before `end`
    (ISO 8601; default now), the number of requests, MAE, bucket accuracy, rank correlation with the true
    lengths and per-bucket recall of their predictions per adapter version and overall."""
    predictor.check_window_s(window_s)
    end_at = parse_moment(end, "end")
    return await run_in_threadpool(predictor.predictor_report, session, services, window_s, end_at)
