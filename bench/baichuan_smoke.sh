#!/usr/bin/env bash
# The Baichuan2 plugin on the GPU device's vLLM 0.26, in one device call (about 5 minutes; not yet run):
#   the tiny 7B and 13B kinds against the plain-torch reference forward (float32), then the published
#   13B shape (bf16, ALiBi) and 7B shape (fp8 weights) with dummy weights, each with the prefix cache.
# Needs, carried: .gpu/vllm-0.26.0-h200.tar.xz (/work/shared/device) and .whl/ with the wheels online fp8
# needs there (compressed-tensors==0.17.0, loguru==0.7.3; `pip download --no-deps --only-binary=:all:
# --python-version 3.12 ...`, see the device README):
#   run(command="OUT=$OUT bash bench/baichuan_smoke.sh", carry=[".gpu", ".whl"], kind="nvidia-h200", timeout_s=600)
set -u
T0=$(date +%s)
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1
mkdir -p /tmp/stage && [ -f /tmp/stage/site/vllm/__init__.py ] || tar -xJf .gpu/vllm-0.26.0-h200.tar.xz -C /tmp/stage
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site2 .whl/*.whl || exit 3
export PYTHONPATH=/tmp/stage/site:/tmp/site2:$PWD
python3 -m app.engine.models.plugin_dist /tmp/pd-plugins || exit 3
export PYTHONPATH=/tmp/pd-plugins:$PYTHONPATH
echo "setup $(( $(date +%s) - T0 )) s"
for c in ${CASES:-tiny-7b tiny-13b shape-13b shape-7b-fp8}; do
  setsid python3 bench/baichuan_smoke.py $c > $OUT/$c.log 2>&1 &
  pid=$!; wait $pid; echo "== $c exit $? at $(( $(date +%s) - T0 )) s"
  kill -9 -- -$pid 2>/dev/null
  grep "^\[$c\]" $OUT/$c.log || tail -25 $OUT/$c.log
done
