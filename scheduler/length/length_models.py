"""The length predictor's fitted models as plain numbers: a boosted tree ensemble and a linear model.

scikit-learn fits them (`fit_model`, imported only then: ~1 s); what is kept, served and stored is the fitted
parameters as lists of floats and ints (`to_dict`/`model_from_dict`), so loading a stored model runs no
code from the artifact and needs no scikit-learn. Each model predicts one feature row in log1p(tokens)
space (`predict_one`):

- `TreeEnsemble`: a fitted `HistGradientBoostingRegressor`'s baseline plus its trees, walked in plain Python
  (sklearn's `predict` validates and parallelises for batches: ~10x slower for a single request). Trees are
  stored in sklearn's pre-order: a split node's children have larger indices than the node, which
  `model_from_dict` checks, so every walk of a loaded tree ends at a leaf.
- `LinearModel`: a `QuantileRegressor`'s coefficients and intercept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scheduler.length.length_predictor_artifact import PredictorArtifactError

MODEL_KINDS = ("hgb", "linear")
NUM_FEATURES = 10  # length of scheduler.length.length_predictor.feature_row: 4 request + 6 history features
# one tree: (value, feature index, threshold, left child, right child, is leaf), one entry per node
Tree = tuple[list[float], list[int], list[float], list[int], list[int], list[bool]]
TREE_FIELDS = ("value", "feature_idx", "num_threshold", "left", "right", "is_leaf")


@dataclass(frozen=True)
class TreeEnsemble:
    """A boosted tree ensemble: raw prediction = baseline + the leaf value of each tree."""

    baseline: float
    trees: tuple[Tree, ...]

    @classmethod
    def from_sklearn(cls, model: Any) -> TreeEnsemble:
        """The trees of a fitted HistGradientBoostingRegressor (numeric features, one output)."""
        trees = []
        for predictors in model._predictors:
            nodes = predictors[0].nodes
            columns = [nodes[name].tolist() for name in TREE_FIELDS[:5]]
            trees.append((*columns, [bool(b) for b in nodes["is_leaf"]]))
        return cls(float(np.ravel(model._baseline_prediction)[0]), tuple(trees))

    def predict_one(self, row: Sequence[float]) -> float:
        """The raw (log-space) prediction of one feature row."""
        total = self.baseline
        for value, feature, threshold, left, right, is_leaf in self.trees:
            node = 0
            while not is_leaf[node]:
                # feature_row never holds NaN, so the missing-value branch of sklearn's walk is not needed
                node = left[node] if row[feature[node]] <= threshold[node] else right[node]
            total += value[node]
        return total

    def to_dict(self) -> dict[str, Any]:
        """Plain data for an artifact (JSON-ready: thresholds may be inf)."""
        trees = [dict(zip(TREE_FIELDS, tree, strict=True)) for tree in self.trees]
        return {"kind": "hgb", "baseline": self.baseline, "trees": trees}


@dataclass(frozen=True)
class LinearModel:
    """A linear model: raw prediction = coef . row + intercept."""

    coef: np.ndarray  # [NUM_FEATURES] float64
    intercept: float

    def predict_one(self, row: Sequence[float]) -> float:
        """The raw (log-space) prediction of one feature row."""
        return float(np.dot(self.coef, row) + self.intercept)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for an artifact."""
        return {"kind": "linear", "coef": self.coef.tolist(), "intercept": self.intercept}


FittedModel = TreeEnsemble | LinearModel


def make_estimator(model_kind: str, seed: int) -> Any:
    """An unfitted scikit-learn estimator of `model_kind` (imports scikit-learn)."""
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.linear_model import QuantileRegressor

    if model_kind == "hgb":
        return HistGradientBoostingRegressor(
            loss="absolute_error",
            max_iter=150,
            learning_rate=0.1,
            max_leaf_nodes=15,
            random_state=seed,
        )
    if model_kind == "linear":
        return QuantileRegressor(quantile=0.5, alpha=0.0, solver="highs")
    raise ValueError(f"unknown model kind {model_kind!r}; choose one of {MODEL_KINDS}")


def fit_model(model_kind: str, seed: int, x: np.ndarray, y: np.ndarray) -> tuple[Any, FittedModel]:
    """Fit an estimator on x [num_samples, NUM_FEATURES] and y [num_samples] (log1p tokens); returns the
    scikit-learn estimator and its plain form."""
    estimator = make_estimator(model_kind, seed).fit(x, y)
    if model_kind == "hgb":
        return estimator, TreeEnsemble.from_sklearn(estimator)
    return estimator, LinearModel(np.asarray(estimator.coef_, dtype=np.float64), float(estimator.intercept_))


def model_from_dict(data: Any) -> FittedModel:
    """The inverse of `to_dict`; PredictorArtifactError names what is malformed (a shape, an index, a kind)."""
    if not isinstance(data, dict):
        raise PredictorArtifactError("model is not an object")
    if data.get("kind") == "hgb":
        trees = tuple(_tree(tree, index) for index, tree in enumerate(_list(data.get("trees"), "trees")))
        return TreeEnsemble(_number(data.get("baseline"), "baseline"), trees)
    if data.get("kind") == "linear":
        coef = [_number(c, "coef") for c in _list(data.get("coef"), "coef")]
        if len(coef) != NUM_FEATURES:
            raise PredictorArtifactError(
                f"linear model has {len(coef)} coefficients, expected {NUM_FEATURES}"
            )
        return LinearModel(np.asarray(coef, dtype=np.float64), _number(data.get("intercept"), "intercept"))
    raise PredictorArtifactError(f"unknown model kind {data.get('kind')!r}; this build reads {MODEL_KINDS}")


def _tree(data: Any, index: int) -> Tree:
    if not isinstance(data, dict):
        raise PredictorArtifactError(f"tree {index} is not an object")
    value, feature, threshold, left, right, is_leaf = (_list(data.get(name), name) for name in TREE_FIELDS)
    num_nodes = len(value)
    if num_nodes == 0 or any(
        len(column) != num_nodes for column in (feature, threshold, left, right, is_leaf)
    ):
        raise PredictorArtifactError(f"tree {index}: node columns are empty or of different lengths")
    tree: Tree = (
        [_number(v, "value") for v in value],
        [_int(f, "feature_idx") for f in feature],
        [_number(t, "num_threshold", allow_inf=True) for t in threshold],
        [_int(n, "left") for n in left],
        [_int(n, "right") for n in right],
        [_bool(b, "is_leaf") for b in is_leaf],
    )
    for node in range(num_nodes):
        if tree[5][node]:
            continue
        if not 0 <= tree[1][node] < NUM_FEATURES:
            raise PredictorArtifactError(
                f"tree {index} node {node}: feature index {tree[1][node]} out of range"
            )
        if not (node < tree[3][node] < num_nodes and node < tree[4][node] < num_nodes):
            raise PredictorArtifactError(
                f"tree {index} node {node}: children must come after the node (pre-order)"
            )
    return tree


def _list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise PredictorArtifactError(f"{name} is not a list")
    return value


def _number(value: Any, name: str, *, allow_inf: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PredictorArtifactError(f"{name} holds {value!r}, not a number")
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise PredictorArtifactError(f"{name} holds {value!r}")
    return float(value)


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PredictorArtifactError(f"{name} holds {value!r}, not an integer")
    return value


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise PredictorArtifactError(f"{name} holds {value!r}, not a boolean")
    return value
