"""Tests of gpu_workers/worker/."""
