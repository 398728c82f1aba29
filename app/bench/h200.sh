#!/usr/bin/env bash
# The H200 benchmark runs of docs/benchmarks.md, one device call each:
#   bash app/bench/h200.sh tune     # flag-by-flag tuning table, 13B shape, app path (+ raw on the winner)
#   bash app/bench/h200.sh serve    # winner: HTTP sweep (client processes), low load, no-reuse and dynamic modes
#   bash app/bench/h200.sh final    # winner: low load on every path, and the GQA shape (Qwen2.5-7B)
#   bash app/bench/h200.sh http     # winner through the OpenAI endpoint: Poisson sweep, client processes
# Needs .gpu/vllm-0.26.0-h200.tar.xz (see /work/shared/device/README.md) and, in .whl/, the wheels of
# uvicorn 0.54.0, httpcore2 2.16.2, truststore 0.10.5 and jiter 0.19.0 (the bundle's openai SDK needs the last three).
set -uo pipefail
stage=${1:?tune, serve or final}
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /tmp/stage && [ -f /tmp/stage/site/vllm/__init__.py ] || tar -xJf .gpu/vllm-0.26.0-h200.tar.xz -C /tmp/stage
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site2 .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/stage/site:/tmp/site2:$PWD
OUT=${OUT:-/tmp/out}; RES=/tmp/res; mkdir -p "$OUT" "$RES"
M=/tmp/stage/model
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$RES/gpu.txt"
python3 -c "import fastapi, uvicorn, openai, httpx2, jiter, matplotlib, psutil; import openai.types.chat
openai.AsyncOpenAI(base_url='http://127.0.0.1:1/v1', api_key='x', http_client=httpx2.AsyncClient()); print('deps ok')" || exit 3

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
  # The winner of "tune" plus the raw-vLLM reference workload's sampling (temperature 0.8, top_p 1).
  W="--set kv_cache_dtype=fp8 --set max_num_seqs=1024 --set cuda_graph_max_batch=1024 --set temperature=0.8"
  bench F-winner 300 $BASE --paths raw,app,http --client-procs 6 --low-load-requests 10 \
    --concurrency 1024 --num-requests 1024 --sweep ${RATES:-65,75,85} --sweep-duration-s 10 $W --set top_p=1.0
  bench G-topp 200 --modes static,dynamic,none --paths app --output-len 128 --concurrency 1024 --num-requests 1024 \
    $W --set top_p=0.9
  ;;
final)
  # The winner through HTTP (client processes), low load on every path, and the GQA shape.
  W="--set kv_cache_dtype=fp8 --set max_num_seqs=1024 --set cuda_graph_max_batch=1024 --set temperature=0.8 --set top_p=1.0"
  bench K-http 290 $BASE --paths raw,app,http --client-procs 6 --low-load-requests 10 \
    --concurrency 1024 --num-requests 1024 --sweep ${RATES:-70,75,80} --sweep-duration-s 10 $W
  bench L-qwen7b 190 --shape qwen2.5-7b --tokenizer-from $M --modes static,none --paths raw,app \
    --concurrency 1024 --num-requests 1024 --output-len 128 $W
  ;;
http)
  # The HTTP sweep alone, results straight into $OUT so a run cut short still returns its numbers.
  RES=$OUT
  W="--set kv_cache_dtype=fp8 --set max_num_seqs=1024 --set cuda_graph_max_batch=1024 --set temperature=0.8 --set top_p=1.0"
  bench M-http 300 --modes "" --paths http --client-procs 6 --num-requests 1 --output-len 128 \
    --sweep ${RATES:-75,70,80} --sweep-duration-s 10 $W
  exit 0
  ;;
esac
tar -czf "$OUT/results-$stage.tar.gz" -C "$RES" .
echo "=== done $(date +%T)"
