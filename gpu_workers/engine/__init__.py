"""The engine: model runner, layers, models, loaders, kernels, its core loop and config."""
