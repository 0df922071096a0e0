#!/usr/bin/env bash
# The native engine on a CUDA machine (a lent GPU, see the device tool): the engine tests on CUDA, lorahost vs
# transformers + peft throughput on the same GPU in the same run, the twin profile of this engine on that GPU,
# and the twin's fidelity against it; apart, `gpu_engine`: lorahost vs transformers + peft on an 8B-shaped Llama
# and the small demo model with 16/64/256 adapters against the HBM floor (benchmarks/gpu_engine_bench.py, one
# table, ~7 minutes: run it alone); `scheduling`: issue 36's real-engine goal on the GPU (benchmarks/scheduling.py,
# FIFO vs the platform's multi-queue at ~1.1x the measured capacity, memory-bound, conv trace, SCHED_SEEDS seeds
# of SCHED_REQUESTS requests, ~4-5 minutes: run it first, before the GPU has served anything else). Logs and JSON go to $GPU_CHECK_WORK/out; at the end $OUT (default
# /tmp/gpu-check) gets the main results and one archive of everything (the device tool returns 8 files at most).
#
#   bash benchmarks/gpu_check.sh [STEPS]     STEPS: comma list of tests,throughput,profile,fidelity (the default),
#                                            gpu_engine, scheduling and audit (after profile: where a GPU worker's
#                                            serving steps and TTFT go that the twin does not charge)
#
# The machine needs python3 with torch (CUDA), transformers, peft, safetensors, tokenizers, numpy, pytest and
# hypothesis; any other package the project imports is installed from wheels in .whl/ when that folder exists
# (python3 -m pip download --no-deps ... -d .whl, the device tool's README). The workload is the generated
# `small` demo model (hidden 1024, 8 layers, bf16) with 16 adapters of ranks 8-128 on q/k/v/o, built on the
# machine's CPU while the tests use the GPU. The conversation trace is read from $GPU_CHECK_TRACE (default
# .gpu/azure_llm_2023_conv.csv: copy ../shared/data/azure_llm_2023_conv.csv there, since only the checkout
# travels). Each step has its own time limit (seconds: TESTS_S, THROUGHPUT_S, PROFILE_S, FIDELITY_S, GPU_ENGINE_S).
set -u
FINAL_OUT=${OUT:-/tmp/gpu-check}
STEPS=${1:-tests,throughput,profile,fidelity}
PY=${PYTHON:-python3}
WORK=${GPU_CHECK_WORK:-/tmp/gpu-check-work}
MODEL=$WORK/small16
OUT=$WORK/out
TRACE=${GPU_CHECK_TRACE:-.gpu/azure_llm_2023_conv.csv}
mkdir -p "$OUT" "$WORK" "$FINAL_OUT"

collect() {
  for f in device.txt engine_tests.log engine_throughput.jsonl twin-profile.json twin_fidelity.json fidelity.log \
    gpu_engine.json scheduling.txt step_audit.txt; do
    [ -f "$OUT/$f" ] && cp "$OUT/$f" "$FINAL_OUT/"
  done
  tar czf "$FINAL_OUT/gpu-check-all.tgz" -C "$WORK" out
}
trap collect EXIT

if ! $PY -c "import pydantic_settings, fastapi, gguf" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_check: installing .whl/ failed"; exit 1; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export LORAHOST_ENGINE_KERNEL_CHOICES_PATH=$WORK/kernel_choices.json

has() { [[ ",$STEPS," == *",$1,"* ]]; }
step() { echo "=== $1 ($(date -u +%T))"; }

step device
$PY - <<'EOF' 2>&1 | tee "$OUT/device.txt"
import platform
import torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"{p.total_memory / 2**30:.0f} GiB", p.multi_processor_count, "SMs")
else:
    print("gpu none: every step runs on the CPU")
print("cpu", platform.processor() or platform.machine())
EOF

if has gpu_engine; then
  step gpu_engine
  # Before anything else runs on the host: the peers are launch-bound, a busy CPU would slow them. The models and
  # adapters are made on the GPU (nothing to build); the table goes to stdout, the peers' logs to the archive.
  # GPU_ENGINE_ARGS: more options (e.g. --smoke on a CPU, --models 8b, --batch 64).
  limit=${GPU_ENGINE_S:-430}
  # shellcheck disable=SC2086
  timeout "$limit" $PY benchmarks/gpu_engine_bench.py --time-limit $((limit - 20)) --work-dir "$WORK/gpu_engine" \
    --out "$OUT/gpu_engine.json" ${GPU_ENGINE_ARGS:-} 2>"$OUT/gpu_engine.log" | tee "$OUT/gpu_engine.txt"
  echo "gpu_engine rc=${PIPESTATUS[0]}"
fi

if has scheduling; then
  step scheduling
  # The same memory-bound configuration as the CPU runs in RESULTS.md (issue 36 section 1: KV for 8 max-length
  # requests under 32 slots, 20% of 100 adapters' bytes on the device), on the GPU's own host->device link
  # (--link-gbps 0: no emulated link). Each seed is a new draw of the workload and its own capacity measurement;
  # a seed takes ~115 s on an H200 (the first also builds the 100-adapter model, ~35 s; a seed whose measured
  # capacity is low replays slower, so keep SCHED_S well above that). Without $TRACE the bench falls back to a
  # synthetic trace of the same shape and says so in scheduling.log.
  for seed in ${SCHED_SEEDS:-0 1 2}; do
    timeout "${SCHED_S:-200}" $PY benchmarks/scheduling.py --policies fifo,multiqueue --cache on --loads 1.1 \
      --num-requests "${SCHED_REQUESTS:-360}" --seed "$seed" --link-gbps 0 --engine-args '{"max_num_seqs": 32}' \
      --trace "$TRACE" \
      --out "$OUT/scheduling-$seed.json" 2>>"$OUT/scheduling.log" | tee -a "$OUT/scheduling.txt"
    echo "scheduling seed $seed rc=${PIPESTATUS[0]}"
  done
fi

# The workload on the CPU, in the background, while the tests use the GPU (only the other steps need it).
workload=
if has throughput || has profile || has fidelity || has audit; then
  (
    if [ ! -f "$MODEL/adapters/adapter-15/adapter_model.safetensors" ]; then
      $PY -m lorahost.cli demo-model "$MODEL" --size small --num-adapters 16 --target-modules q_proj,k_proj,v_proj,o_proj
    fi
  ) >"$OUT/workload.log" 2>&1 &
  workload=$!
fi

if has tests; then
  step tests
  # TRITON_INTERPRET=0: the Triton kernels' parity tests run compiled on the GPU, not interpreted on the CPU
  TRITON_INTERPRET=0 timeout "${TESTS_S:-150}" $PY -m pytest -q -p no:cacheprovider tests/gpu_workers/engine --tb=short \
    --junitxml="$OUT/engine_tests.xml" >"$OUT/engine_tests.log" 2>&1
  echo "tests rc=$?"
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/engine_tests.log" | tail -40
fi

if [ -n "$workload" ]; then
  wait $workload || { echo "gpu_check: the workload failed"; tail -20 "$OUT/workload.log"; exit 1; }
fi

if has throughput; then
  step throughput
  # Both engines in one run on the same GPU (64 requests x 200 prompt tokens, 32 out, 16 adapters); the first
  # timed run still meets new shapes, so 4 repeats and the median.
  timeout "${THROUGHPUT_S:-150}" $PY benchmarks/engine_throughput.py --model-dir "$MODEL" --systems lorahost,hf \
    --modes base,lora --repeats 4 --no-floor --num-requests 64 --timeout 70 --out "$OUT/engine_throughput.jsonl" \
    2>>"$OUT/throughput.log" | cut -c1-300
  # The GPU's kernel forms are fixed, not tuned (kernel_plan.py): measure the other ones.
  for form in decode_lora_form=stacked decode_attention=grouped_matmul; do
    name=${form%%=*}
    env "LORAHOST_ENGINE_${name^^}=${form#*=}" timeout "${VARIANT_S:-40}" $PY benchmarks/engine_throughput.py \
      --model-dir "$MODEL" --systems lorahost --modes lora --repeats 4 --no-floor --num-requests 64 --timeout 35 \
      --out "$OUT/engine_throughput_$name.jsonl" 2>>"$OUT/throughput.log" | grep '"lorahost"' | cut -c1-300
  done
fi

PROFILE=${GPU_CHECK_PROFILE:-$OUT/twin-profile.json}  # a profile measured earlier, for the fidelity step alone
if has profile; then
  step profile
  LORAHOST_ENGINE_MAX_NUM_BATCHED_TOKENS=16384 timeout "${PROFILE_S:-120}" $PY -m lorahost.cli profile \
    --base-model "$MODEL/base" --work-dir "$WORK/profile" --output "$OUT/router-profile.json" \
    --twin-output "$PROFILE" --batch-sizes 1,8,32,64 --prompt-tokens 16,64,256 --repeats 2 >"$OUT/profile.log" 2>&1
  echo "profile rc=$?"
  tail -15 "$OUT/profile.log"
fi

if has fidelity; then
  step fidelity
  [ -f "$PROFILE" ] || { echo "gpu_check: no profile at $PROFILE: run the profile step first"; exit 1; }
  timeout "${FIDELITY_S:-150}" $PY benchmarks/twin_fidelity.py --model-dir "$MODEL" --profile "$PROFILE" \
    --conv-trace "$TRACE" --traces conv --loads 0.5,0.9,1.2 --policies "${FIDELITY_POLICIES:-fifo}" \
    --memory-modes unified --num-adapters 16 --bounds slot --num-requests 60 --max-prompt 512 --max-output 64 \
    --max-num-seqs 32 --repeats "${FIDELITY_REPEATS:-1}" \
    --output "$OUT/twin_fidelity.json" >"$OUT/fidelity.log" 2>&1
  echo "fidelity rc=$?"
  tail -25 "$OUT/fidelity.log"
fi
if has audit; then
  step audit
  # benchmarks/twin_step_audit.py on the fidelity step's x0.9 case: every real step's wall time against the
  # profile's price, by kind (host-assisted, preparing, copying, clean), and each request's TTFT split into
  # waiting and its first token's steps, real against twin (the H200's serving steps took 1.1-1.6x the profiled
  # ones and its queueing 5-15x the twin's in the first run with repeats: RESULTS.md, issue 36 on an H200).
  [ -f "$PROFILE" ] || { echo "gpu_check: no profile at $PROFILE: run the profile step first"; exit 1; }
  timeout "${AUDIT_S:-120}" $PY benchmarks/twin_step_audit.py --case "${AUDIT_CASE:-conv/slot/unified/fifo/a16/x0.9}" \
    --model-dir "$MODEL" --profile "$PROFILE" --conv-trace "$TRACE" --num-requests 60 --max-prompt 512 \
    --max-output 64 --max-num-seqs 32 --steps-output "$OUT/step_audit.json" >"$OUT/step_audit.txt" \
    2>"$OUT/step_audit.log"
  echo "audit rc=$?"
  cat "$OUT/step_audit.txt"
fi
step done
