"""Tests of gpu_workers/engine/."""
