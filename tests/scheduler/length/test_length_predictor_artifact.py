"""The length predictor's artifact (scheduler/length/length_predictor_artifact.py): plain JSON round trips that keep
every number, old pickles refused without unpickling, clear errors for anything unusable."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from scheduler.length.length_predictor import (
    LengthPredictor,
    RequestFeatures,
)
from scheduler.length.length_predictor_artifact import (
    ARTIFACT_FORMAT_VERSION,
    ARTIFACT_MAGIC,
    PredictorArtifactError,
)
from tests.scheduler.length.conftest import MAX_TOKENS


def test_round_trip_predicts_the_same(fitted: LengthPredictor) -> None:
    loaded = LengthPredictor.from_bytes(fitted.to_bytes())
    assert loaded.model_version == "test-1"
    assert loaded.num_training_samples == 2400
    for adapter in ("A", "B", "C", "new", None):
        for num_prompt in (10, 200, 700):
            features = RequestFeatures(adapter, num_prompt, MAX_TOKENS)
            assert loaded.predict(features) == fitted.predict(features)
    assert loaded.history(None, "A").to_state() == fitted.history(None, "A").to_state()


def _artifact(**changes: Any) -> bytes:
    """A valid unfitted artifact's JSON with top-level keys replaced."""
    state = json.loads(LengthPredictor().to_bytes()[len(ARTIFACT_MAGIC) :])
    return ARTIFACT_MAGIC + json.dumps({**state, **changes}).encode()


def _hgb_model(**tree: Any) -> dict[str, Any]:
    nodes = {
        "value": [0.0, 1.0, 2.0],
        "feature_idx": [0, 0, 0],
        "num_threshold": [1.0, 0.0, 0.0],
        "left": [1, 0, 0],
        "right": [2, 0, 0],
        "is_leaf": [False, True, True],
    }
    return {"kind": "hgb", "baseline": 0.5, "trees": [{**nodes, **tree}]}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"not an artifact at all", "bad header"),
        (ARTIFACT_MAGIC + b"{garbage", "corrupt"),
        (ARTIFACT_MAGIC + b"\xff\xfe", "corrupt"),
        (ARTIFACT_MAGIC + b"[1, 2]", "not a JSON object"),
        (ARTIFACT_MAGIC + b'{"format_version": 99}', "format version 99"),
        (_artifact(format_version=1), "format version 1.*retrain"),  # pre-issue-19
        (_artifact(histories=None), "malformed"),
        (_artifact(histories=[["t", "a", "not lengths", None]]), "malformed"),
        (_artifact(config={"max_history": 4, "unknown": 1}), "malformed"),
        (_artifact(model_kind="forest"), "malformed.*unknown model kind"),
        (_artifact(model={"kind": "forest"}), "malformed.*unknown model kind"),
        (_artifact(model={"kind": "linear", "coef": [1.0], "intercept": 0.0}), "1 coefficients"),
        (_artifact(model_kind="linear", model=_hgb_model()), "a hgb model in a linear artifact"),
        (_artifact(model=_hgb_model(left=[0, 0, 0])), "children must come after the node"),
        (_artifact(model=_hgb_model(right=[7, 0, 0])), "children must come after the node"),
        (_artifact(model=_hgb_model(feature_idx=[10, 0, 0])), "feature index 10 out of range"),
        (_artifact(model=_hgb_model(value=[0.0, 1.0])), "different lengths"),
        (_artifact(model=_hgb_model(is_leaf=[0, 1, 1])), "not a boolean"),
        (_artifact(model=_hgb_model(value=[0.0, "x", 2.0])), "not a number"),
    ],
)
def test_unusable_artifact_raises_a_clear_error(data: bytes, message: str) -> None:
    with pytest.raises(PredictorArtifactError, match=message):
        LengthPredictor.from_bytes(data)


UNPICKLED: list[str] = []


def record_unpickling(what: str) -> None:
    UNPICKLED.append(what)


class _RunsCodeWhenUnpickled:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return record_unpickling, ("code from the artifact ran",)


@pytest.mark.parametrize("format_version", [1, 2])
def test_an_old_pickle_artifact_is_refused_without_unpickling_it(format_version: int) -> None:
    state = {"format_version": format_version, "model": _RunsCodeWhenUnpickled(), "histories": {}}
    data = ARTIFACT_MAGIC + pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    with pytest.raises(PredictorArtifactError, match="is a pickle.*retrain to replace it"):
        LengthPredictor.from_bytes(data)
    assert UNPICKLED == []
    pickle.loads(data[len(ARTIFACT_MAGIC) :])  # the probe itself works: unpickling would have run it
    assert UNPICKLED == ["code from the artifact ran"]
    UNPICKLED.clear()


def test_a_hand_written_tree_predicts_by_walking_it() -> None:
    predictor = LengthPredictor.from_bytes(_artifact(model=_hgb_model()))
    assert predictor._model is not None
    assert predictor._model.predict_one([1.0] + [0.0] * 9) == 1.5  # 1.0 <= threshold 1.0: left leaf
    assert predictor._model.predict_one([1.5] + [0.0] * 9) == 2.5


def test_round_trip_is_plain_json_and_keeps_every_number(fitted: LengthPredictor) -> None:
    data = fitted.to_bytes()
    document = json.loads(data[len(ARTIFACT_MAGIC) :])
    assert document["format_version"] == ARTIFACT_FORMAT_VERSION and document["model"]["kind"] == "hgb"
    loaded = LengthPredictor.from_bytes(data)
    assert loaded._model == fitted._model
    assert loaded.to_bytes() == data


def test_history_keys_must_be_json_scalars() -> None:
    predictor = LengthPredictor()
    predictor.observe("t", ("not", "a", "scalar"), 5)
    with pytest.raises(TypeError, match="must be str, int or None"):
        predictor.to_bytes()


def test_truncated_artifact_raises_a_clear_error(fitted: LengthPredictor) -> None:
    data = fitted.to_bytes()
    with pytest.raises(PredictorArtifactError, match="corrupt"):
        LengthPredictor.from_bytes(data[: len(data) // 2])


def test_unfitted_artifact_round_trips_to_the_prior() -> None:
    predictor = LengthPredictor()
    predictor.observe(None, "A", 7)
    loaded = LengthPredictor.from_bytes(predictor.to_bytes())
    assert not loaded.is_fitted
    assert loaded.predict(RequestFeatures("A", 10, 100)) == 7
