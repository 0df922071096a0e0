"""The output-length prediction step: how many tokens a prepared request is expected to generate.

The prediction is a policy input, carried end to end: the router sees it (RouteRequest), the worker gets it
(GenerateRequest.predicted_output_tokens, for its batch policy) and the usage row records it next to the
true count (UsageRecord.predicted_output_tokens), so a predictor's error can be measured from usage
(GET /v1/admin/predictor). The usage row also records what the prediction saw (max_tokens, is_chat, has_stop;
the prompt's size is prompt_tokens): the training data of the learned predictor. Nothing derived from the
prompt's content is used or stored (a stored n-gram histogram of a prompt narrowed down what it said).

services.predictor is an `OutputLengthPredictor` chosen by settings.predictor.length_predictor: `learned`
(api/inference/learned_predictor.py, the default) or `max_tokens` (`MaxTokensPredictor`: every request is
expected to use all of its max_tokens). A prediction is clamped to [1, max_tokens]: a request never
generates more than max_tokens, and never fewer than one token.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from api.request_meter import RequestMeter

if TYPE_CHECKING:
    from api.inference.prepare import Prepared


@dataclass(frozen=True)
class PredictionInput:
    """What a predictor may use: the tenant and the adapter version (None: the base model), which together pick
    the history a prediction reads, the sizes, chat or completion, and whether stop strings are set."""

    tenant_id: str | None
    adapter_key: str | None
    num_prompt_tokens: int
    max_tokens: int
    is_chat: bool = False
    has_stop: bool = False


class OutputLengthPredictor(Protocol):
    """A policy predicting a request's output length in tokens."""

    def predict(self, request: PredictionInput) -> int:
        """The expected number of output tokens."""
        ...


class MaxTokensPredictor:
    """The placeholder policy: every request is expected to use all of its max_tokens."""

    def predict(self, request: PredictionInput) -> int:
        """The request's max_tokens."""
        return request.max_tokens


def prediction_input(prepared: Prepared) -> PredictionInput:
    """The predictor's view of a prepared request."""
    return PredictionInput(
        tenant_id=prepared.generate.tenant_id,
        adapter_key=prepared.route.adapter_key,
        num_prompt_tokens=prepared.route.num_prompt_tokens,
        max_tokens=prepared.max_tokens,
        is_chat=prepared.kind == "chat",
        has_stop=bool(prepared.generate.sampling.stop),
    )


def predict(prepared: Prepared, predictor: OutputLengthPredictor, meter: RequestMeter) -> int:
    """Predict the output length and carry it on the route, the worker request and the meter (returned); the
    meter also records the prediction's inputs (the training data of the learned predictor)."""
    request = prediction_input(prepared)
    predicted = min(max(1, predictor.predict(request)), prepared.max_tokens)
    prepared.route = replace(prepared.route, predicted_output_tokens=predicted)
    prepared.generate.predicted_output_tokens = predicted
    meter.predicted_output_tokens = predicted
    meter.max_tokens, meter.is_chat, meter.has_stop = request.max_tokens, request.is_chat, request.has_stop
    return predicted
