"""Chameleon's output-length predictor: request features + a (tenant, adapter) history -> output tokens, pure.

- `length_predictor.py`: the features, the per-(tenant, adapter) histories, fit / predict / evaluate;
- `length_models.py`: the fitted models as plain numbers (boosted trees, a linear model);
- `length_predictor_artifact.py`: the stored artifact's format (JSON behind a header; nothing executed on load);
- `length_metrics.py`: what scheduling needs of predictions beyond MAE (Spearman, per-bucket recall).
Training, storage and serving live in registry/ (predictor_training.py, predictor_artifacts.py) and
api/inference/learned_predictor.py.
"""
