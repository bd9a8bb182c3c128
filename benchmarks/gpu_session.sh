#!/usr/bin/env bash
# DeepSpeed for the all-GPU ZeRO-3 test: the lent machine has no network, so the suite's ZeRO-3 fine-tune
# (acceptance/test_finetune.py, on every GPU; not at --level quick) runs only if DeepSpeed is importable or
# lies in the session's wheel folder ($WHEELS, default .whl) before the session starts: an sdist
# (deepspeed-*.tar.gz, always built below with DS_BUILD_OPS=0) or a wheel (deepspeed-*.whl, installed below
# with the folder's other wheels, which happens only when one of them is missing). Without it that test skips,
# saying DeepSpeed is not installed, and the session's verdict says nothing about ZeRO-3.
#
# One GPU session, one command: the suite at --level standard beside mamf-finder and nccl-tests on the
# same machine, the matmul / host link / latency / MFU diagnostics, all tarred into $OUT/session.tgz, and
# a comparison table printed last. For a lent machine with no network, within about 9 minutes.
#
#   benchmarks/gpu_session.sh [--mamf PATH/mamf-finder.py] [--nccl-tests DIR] [--budget SECONDS]
#
# The peers stay outside the repository; their paths come from the options or the environment:
#   MAMF_FINDER  mamf-finder.py (default: the first .peers/**/benchmarks/mamf-finder.py)
#   NCCL_TESTS   an nccl-tests checkout built on the device (default .peers/nccl-tests), e.g.
#                ln -s libnccl.so.2 <torch's nvidia/nccl>/lib/libnccl.so
#                make -C .peers/nccl-tests MPI=0 NCCL_HOME=<torch's nvidia/nccl>
#   WHEELS       wheels the device lacks (default .whl: pytest-html, pytest-metadata, jsonschema-rs, detect-secrets),
#                installed into a private directory (mktemp -d under $TMPDIR) removed at the end
#   OUT          where the session goes (the device tool sets it; default reports/gpu-session-<time>)
#   SESSION_LEVEL  the suite's level (default standard)
#   SESSION_DIAGS  none: skip the diagnostics after the peers (step 4), for a caller that runs its own
# Steps run in order of importance, each with a time limit that leaves the later ones their share of the
# budget (SESSION_BUDGET_S, default 530 s); a step that no longer fits is skipped and says so. Without a
# GPU the same script runs on 2 CPU ranks under the cpu profile (a dry run of the session itself).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
START=$(date +%s)
BUDGET=${SESSION_BUDGET_S:-530}
LEVEL=${SESSION_LEVEL:-standard}
MAMF_FINDER=${MAMF_FINDER:-}
NCCL_TESTS=${NCCL_TESTS:-.peers/nccl-tests}
WHEELS=${WHEELS:-.whl}
while [ $# -gt 0 ]; do
  case "$1" in
    --mamf) MAMF_FINDER=$2; shift 2 ;;
    --nccl-tests) NCCL_TESTS=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    *) echo "gpu_session: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-$ROOT/reports/gpu-session-$(date -u +%Y%m%dT%H%M%S)}
S=$OUT/session
mkdir -p "$S"/suite "$S"/mamf "$S"/nccl-tests "$S"/diag
LOG=$S/session.log

# NVLink multicast (NVLS) stays off on the lent machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

say() { printf '[%4ds] %s\n' "$(( $(date +%s) - START ))" "$*" | tee -a "$LOG"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
# step NAME MOST RESERVE CMD...: run CMD (output in $S/NAME.out) for at most MOST seconds, and never into the
# RESERVE seconds that the later steps need.
step() {
  local name=$1 most=$2 reserve=$3 limit rc
  shift 3
  limit=$(( $(left) - reserve ))
  [ "$limit" -gt "$most" ] && limit=$most
  if [ "$limit" -lt 15 ]; then say "SKIPPED $name: $(left) s of the budget left"; return 0; fi
  say "start $name (limit ${limit} s)"
  timeout --kill-after=15 "$limit" "$@" >"$S/$name.out" 2>&1
  rc=$?
  say "end $name: exit $rc$([ $rc -eq 124 ] && echo ' (time limit reached)')"
}

# Wheels the device lacks go to a directory of this session's own (mktemp -d: mode 0700, a new name), never a
# fixed /tmp path: whatever another user put there first would be imported by every rank.
SITE=$(mktemp -d "${TMPDIR:-/tmp}/gpu-session-site.XXXXXX") || { echo "gpu_session: mktemp -d failed" >&2; exit 2; }
trap 'rm -rf "$SITE"' EXIT
if [ -d "$WHEELS" ] && ! python3 -c "import pytest_html, pytest_metadata, jsonschema_rs, detect_secrets" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl >>"$LOG" 2>&1 \
    && export PYTHONPATH="$PYTHONPATH:$SITE"
fi
# DeepSpeed has no wheel: its sdist, built without its compiled ops (the suite uses torch's AdamW).
DS_SDIST=$(find "$(realpath "$WHEELS" 2>/dev/null)" -maxdepth 1 -name "deepspeed-*.tar.gz" 2>/dev/null | head -1)
if [ -n "$DS_SDIST" ] && ! python3 -c "import deepspeed" 2>/dev/null; then
  (cd "$SITE" && DS_BUILD_OPS=0 PYTHONPATH=$SITE timeout 180 python3 -m pip install -q --no-index --no-deps \
    --no-build-isolation --target "$SITE" "$DS_SDIST") >>"$LOG" 2>&1 || say "deepspeed did not install (see $LOG)"
  export PYTHONPATH="${PYTHONPATH%:"$SITE"}:$SITE"
fi
if [ -z "$MAMF_FINDER" ] && [ -d .peers ]; then
  MAMF_FINDER=$(find .peers -name mamf-finder.py -path '*benchmarks*' 2>/dev/null | head -1)
fi
NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$NGPU" -ge 1 ]; then
  GPU_NAME=$(python3 -c "import torch; print(torch.cuda.get_device_name(0))")
  NPROC=$NGPU
  PROFILE=$(python3 benchmarks/session_tools.py profile --gpus "$NGPU" --gpu-name "$GPU_NAME" -o "$S/thresholds.yaml")
else
  GPU_NAME="no GPU (dry run on 2 CPU ranks)"
  NPROC=2
  PROFILE=cpu
  cp thresholds.yaml "$S/thresholds.yaml"
fi
PEAK=$(python3 benchmarks/session_tools.py setting peak_bf16_tflops --thresholds "$S/thresholds.yaml" --profile "$PROFILE")
say "GPUs: $NGPU x $GPU_NAME; profile $PROFILE; mamf-finder: ${MAMF_FINDER:-none}; nccl-tests: $NCCL_TESTS; budget ${BUDGET} s"
{ nvidia-smi -q -d POWER,CLOCK,PERFORMANCE,TEMPERATURE 2>&1 | head -200; nvidia-smi topo -m 2>&1
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  git -C "$ROOT" log -1 --oneline 2>/dev/null; env | grep -E '^(NCCL|TORCH|CUDA)_' | sort; } >"$S/environment.txt" 2>&1

# 1. The suite under the shipped profile for this node's shape (session_tools.py profile: the one the run chooses).
step suite/run 400 140 torchrun --standalone --nproc-per-node="$NPROC" -m pytest acceptance --level "$LEVEL" \
  --thresholds "$S/thresholds.yaml" --profile "$PROFILE" --report-dir "$S/suite"

# 2. nccl-tests on this machine: 8 B latency without and with CUDA graphs, busbw at 1 GiB (2+ GPUs).
AR=$NCCL_TESTS/build/all_reduce_perf
if [ "$NGPU" -ge 2 ] && [ -x "$AR" ]; then
  NCCL_LIB=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0] + '/lib')" 2>/dev/null || true)
  export LD_LIBRARY_PATH="$NCCL_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  step nccl-tests/all_reduce_8B 40 190 "$AR" -b 8 -e 8 -g "$NGPU"
  step nccl-tests/all_reduce_8B_graph 40 180 "$AR" -b 8 -e 8 -g "$NGPU" -G 20
  step nccl-tests/all_reduce_1G 40 170 "$AR" -b 1G -e 1G -g "$NGPU"
else
  say "SKIPPED nccl-tests: $([ "$NGPU" -lt 2 ] && echo "$NGPU GPU: no small-message latency to compare" \
    || echo "$AR not built")"
fi

# 3. mamf-finder over the suite's own shapes, bf16 then fp16, every GPU at once (as the suite measures).
if [ "$NGPU" -ge 1 ] && [ -n "$MAMF_FINDER" ] && [ -f "$MAMF_FINDER" ]; then
  step mamf/bf16 100 90 python3 benchmarks/session_tools.py mamf --finder "$MAMF_FINDER" --dtype bfloat16 \
    --gpus "$NGPU" --out "$S/mamf"
  step mamf/fp16 100 5 python3 benchmarks/session_tools.py mamf --finder "$MAMF_FINDER" --dtype float16 \
    --gpus "$NGPU" --out "$S/mamf"
else
  say "SKIPPED mamf-finder: $([ "$NGPU" -lt 1 ] && echo "no GPU" || echo "not found (set MAMF_FINDER or --mamf)")"
fi

# 4. Diagnostics while time is left: latency split (2+ GPUs), the matmul sweep timed as mamf-finder times it
# and settled, host link alone vs all at once, GPT MFU at batch 32 beside the suite's 64.
if [ "${SESSION_DIAGS:-all}" = none ]; then
  say "SKIPPED the diagnostics (SESSION_DIAGS=none)"
elif [ "$NGPU" -ge 2 ]; then
  step diag/latency 60 5 torchrun --standalone --nproc-per-node="$NPROC" benchmarks/latency_diag.py \
    --out "$S/diag/latency.json"
  step diag/latency_no_flight_recorder 60 5 env TORCH_NCCL_TRACE_BUFFER_SIZE=0 torchrun --standalone \
    --nproc-per-node="$NPROC" benchmarks/latency_diag.py --out "$S/diag/latency_no_flight_recorder.json"
fi
if [ "${SESSION_DIAGS:-all}" != none ]; then
  step diag/matmul_bf16 100 5 torchrun --standalone --nproc-per-node="$NPROC" benchmarks/matmul_diag.py \
    --dtype bf16 --sustain-s 5 --out "$S/diag/matmul_bf16.json"
  step diag/hostlink 45 5 torchrun --standalone --nproc-per-node="$NPROC" -m workloads.gpu.hostlink --mode both \
    --level "$LEVEL"
  step diag/gpt_batch32 120 5 torchrun --standalone --nproc-per-node="$NPROC" -m workloads.training.gpt \
    --level "$LEVEL" --batch-size 32 ${PEAK:+--peak-tflops "$PEAK"}
fi

# 5. One tarball, the table last.
python3 benchmarks/session_tools.py table "$S" >"$S/table.txt" 2>&1
tar czf "$OUT/session.tgz" -C "$OUT" session
say "session: $OUT/session.tgz ($(du -h "$OUT/session.tgz" | cut -f1)), $(( $(date +%s) - START )) s"
cat "$S/table.txt"
