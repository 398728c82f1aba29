#!/usr/bin/env bash
# The H200 benchmark runs of docs/benchmarks.md, one device call each:
#   bash app/bench/h200.sh tune     # flag-by-flag tuning table, 13B shape, app path (+ raw on the winner)
#   bash app/bench/h200.sh serve    # winner: HTTP sweep (client processes), low load, no-reuse and dynamic modes
#   bash app/bench/h200.sh shapes   # GQA shape (Qwen2.5-7B), 2,000-token template, vLLM's own server
# Needs .gpu/vllm-0.26.0-h200.tar.xz (see /work/shared/device/README.md) and .whl/uvicorn-*.whl.
set -uo pipefail
stage=${1:?tune, serve or shapes}
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /tmp/stage && [ -f /tmp/stage/site/vllm/__init__.py ] || tar -xJf .gpu/vllm-0.26.0-h200.tar.xz -C /tmp/stage
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site2 .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/stage/site:/tmp/site2:$PWD
OUT=${OUT:-/tmp/out}; RES=/tmp/res; mkdir -p "$OUT" "$RES"
M=/tmp/stage/model
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$RES/gpu.txt"
python3 -c "import fastapi, uvicorn, openai, httpx, matplotlib, psutil; print('deps ok')" || exit 3

bench() {  # bench NAME TIMEOUT_S ARGS...: one engine in its own process group, ended by its id
  local name=$1 limit=$2; shift 2
  echo "=== $name $(date +%T): $*"
  setsid timeout -k 10 "$limit" python3 -m app.bench --shape $M --data-dir /tmp/pd --out "$RES/$name" "$@" \
    > "$RES/$name.log" 2>&1 &
  local pid=$!
  wait $pid; echo "=== $name exit $? $(date +%T)"
  kill -9 -- -$pid 2>/dev/null; sleep 2
  grep -E "^(Prefix|无Prefix|mode|highest|static:|none:|dynamic:)|app.bench|Error|error" "$RES/$name.log" | grep -v "INFO" | tail -25
}

BASE="--modes static --output-len 128 --templates ecommerce"
case $stage in
tune)
  bench A-defaults 130 $BASE --paths app --concurrency 1024 --num-requests 1024 \
    --set cascade_attention=false --set kv_cache_dtype=auto --set cuda_graph_max_batch=512 --set max_num_seqs=1024
  bench B-cascade 100 $BASE --paths app --concurrency 1024 --num-requests 1024 \
    --set kv_cache_dtype=auto --set cuda_graph_max_batch=512 --set max_num_seqs=1024
  bench C-fp8 100 $BASE --paths app --concurrency 1024 --num-requests 1024 \
    --set kv_cache_dtype=fp8 --set cuda_graph_max_batch=512 --set max_num_seqs=1024
  bench D-graphs 100 $BASE --paths app --concurrency 1024 --num-requests 1024 \
    --set kv_cache_dtype=fp8 --set cuda_graph_max_batch=1024 --set max_num_seqs=1024
  bench E-seqs1536 140 $BASE --paths raw,app --concurrency 1536 --num-requests 1536 \
    --set kv_cache_dtype=fp8 --set cuda_graph_max_batch=1536 --set max_num_seqs=1536
  ;;
serve)
  W="--set kv_cache_dtype=fp8 --set max_num_seqs=${SEQS:-1536} --set cuda_graph_max_batch=${SEQS:-1536}"
  bench F-sweep 340 $BASE --paths raw,app,http --client-procs 6 --low-load-requests 10 \
    --concurrency ${SEQS:-1536} --num-requests ${SEQS:-1536} --sweep ${RATES:-60,70,75,80,85} --sweep-duration-s 15 $W
  bench G-modes 220 --modes none,dynamic --paths app --output-len 128 --concurrency 1024 --num-requests 1024 $W
  ;;
shapes)
  W="--set kv_cache_dtype=fp8 --set max_num_seqs=${SEQS:-1536} --set cuda_graph_max_batch=${SEQS:-1536}"
  bench H-qwen7b 170 --shape qwen2.5-7b --tokenizer-from $M --modes none,static --paths raw,app \
    --concurrency 1024 --num-requests 1024 --output-len 128 $W
  bench I-long 170 --templates long --modes none,static --paths app --concurrency 1024 --num-requests 1024 \
    --output-len 128 $W
  bench J-vllm-http 220 $BASE --paths http,vllm-http --client-procs 6 --concurrency 1024 --num-requests 1024 $W
  ;;
esac
tar -czf "$OUT/results-$stage.tar.gz" -C "$RES" .
echo "=== done $(date +%T)"
