#!/usr/bin/env bash
# The times issue 55 budgets, on one lent GPU machine in one call (about 8 minutes on one H200):
#   quick:    a fleet's first node with empty compile caches (cold1: compiles and saves its kernels in the shared
#             directory), the next node with empty caches of its own (cold2: loads them), then 3 warm runs;
#   standard: the first node with empty caches (cold1) and a warm run; then the next node's GPT test alone with
#             empty caches (it loads the first node's kernels): the one test whose first run compiles.
# Each from the suite's wheel, run from an empty directory under the shipped profile for the node's shape, Python's
# bytecode compiled into PYTHONPYCACHEPREFIX first (as an image has it), every figure from benchmarks/quick_time.py
# (the start step by step, each test, the kernels compiled or loaded), the GPU's serial beside them; all tarred into
# $OUT/fleet.tgz after each step, so a call stopped at its limit still brings back what ran.
#
#   benchmarks/fleet_time.sh            WHEELS (default .whl): wheels the device lacks (pytest-html, pytest-metadata,
#                                       jsonschema-rs, detect-secrets, deepspeed and its pydantic, hjson), installed
#                                       into a private directory; FLEET_PARTS (default "quick standard")
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
START=$(date +%s)
WHEELS=${WHEELS:-.whl}
PARTS=${FLEET_PARTS:-quick standard}
OUT=${OUT:-$ROOT/reports/fleet-time-$(date -u +%Y%m%dT%H%M%S)}
S=$OUT/fleet
mkdir -p "$S" "$S/shared-quick" "$S/shared-standard"  # the shared directories exist, as a cluster's mount does
LOG=$S/fleet.log
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
say() { printf '[%4ds] %s\n' "$(( $(date +%s) - START ))" "$*" | tee -a "$LOG"; }
pack() { tar czf "$OUT/fleet.tgz" -C "$OUT" --exclude='inductor-cache-*' --exclude='shared*' --exclude='*.html' fleet 2>/dev/null; }

SITE=$(mktemp -d "${TMPDIR:-/tmp}/fleet-site.XXXXXX") || exit 2
RUNDIR=$(mktemp -d "${TMPDIR:-/tmp}/fleet-run.XXXXXX") || exit 2
trap 'rm -rf "$SITE" "$RUNDIR"' EXIT
python3 -m pip wheel -q --no-deps --no-build-isolation -w "$S/wheel" "$ROOT" >>"$LOG" 2>&1 || { say "the suite's wheel did not build"; exit 4; }
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl "$S"/wheel/*.whl >>"$LOG" 2>&1 \
  || { say "the wheels did not install (see $LOG)"; exit 4; }
export PYTHONPATH=$SITE PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/fleet-pycache}
# DeepSpeed (the ZeRO-3 test, standard): its wheel where one was carried, else its sdist built here without ops.
DS_SDIST=$(find "$(realpath "$WHEELS")" -maxdepth 1 -name "deepspeed-*.tar.gz" 2>/dev/null | head -1)
if ! python3 -c "import deepspeed" >/dev/null 2>&1 && [ -n "$DS_SDIST" ]; then
  say "building DeepSpeed from $DS_SDIST"
  (cd "$SITE" && DS_BUILD_OPS=0 timeout 180 python3 -m pip install -q --no-index --no-deps --no-build-isolation \
    --target "$SITE" "$DS_SDIST") >>"$LOG" 2>&1 || say "deepspeed did not install (see $LOG)"
fi
TORCH_DIR=$(python3 -c "import torch, os; print(os.path.dirname(torch.__file__))")
STDLIB=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")
PURE=$(dirname "$TORCH_DIR")
# Every package a run imports (python -X importtime of quick, and of torch.compile's imports: torch._dynamo and
# torch._inductor bring sympy, triton, networkx, jinja2...), as an image has them compiled; a package left out
# would be compiled by the first run alone and make its figure a first run of Python's, not the node's.
IMPORTED="numpy _pytest pytest pluggy iniconfig packaging yaml sympy mpmath triton networkx jinja2 markupsafe filelock
  fsspec requests urllib3 charset_normalizer idna certifi pygments tabulate tqdm opt_einsum functorch torchgen
  typing_extensions.py pynvml.py transformers peft tokenizers safetensors huggingface_hub accelerate regex psutil
  einops hf_xet"
DIRS=()
for name in $IMPORTED; do [ -e "$PURE/$name" ] && DIRS+=("$PURE/$name"); done
say "compileall into $PYTHONPYCACHEPREFIX: the standard library, torch, the wheels and ${#DIRS[@]} packages the run imports"
python3 -m compileall -q -j 0 "$STDLIB" "$TORCH_DIR" "${DIRS[@]}" "$SITE" >/dev/null 2>&1
say "compileall done"
{ nvidia-smi --query-gpu=name,serial,uuid,driver_version,power.limit,clocks.max.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  python3 -c "import clustergate, deepspeed; print('clustergate', clustergate.__file__, 'deepspeed', deepspeed.__version__)"
  nproc; git -C "$ROOT" log -1 --oneline 2>/dev/null; } >"$S/machine.txt" 2>&1
cat "$S/machine.txt" | tee -a "$LOG"
QT="python3 $ROOT/benchmarks/quick_time.py run"
cd "$RUNDIR" || exit 2  # an empty directory: the suite comes from its wheel, nothing from the checkout
for part in $PARTS; do
  case $part in
    quick)
      say "quick: cold x2 (node 1 compiles, node 2 loads), warm x3"
      timeout 170 $QT --cold 2 --warm 3 --out "$S/quick" -- python3 -m clustergate run --level quick \
        --shared-dir "$S/shared-quick" >"$S/quick.txt" 2>&1
      say "quick: exit $?"; pack ;;
    standard)
      say "standard: cold x1 (node 1 compiles), warm x1"
      timeout 300 $QT --cold 1 --warm 1 --out "$S/standard" -- python3 -m clustergate run --level standard \
        --shared-dir "$S/shared-standard" >"$S/standard.txt" 2>&1
      say "standard: exit $?"; pack
      say "standard, node 2's first run of the GPT test (empty caches, the shared kernels)"
      timeout 50 $QT --cold 1 --warm 0 --out "$S/standard-gpt-node2" -- python3 -m clustergate run --level standard \
        -k test_gpt_throughput --shared-dir "$S/shared-standard" >"$S/standard-gpt-node2.txt" 2>&1
      say "standard gpt node 2: exit $?"; pack ;;
    finetune)  # the fine-tunes alone at standard, twice (their windows: docs/checks.md)
      timeout 150 $QT --cold 0 --warm 2 --out "$S/finetune" -- python3 -m clustergate run --level standard \
        -k finetune --shared-dir "$S/shared-standard" >"$S/finetune.txt" 2>&1
      say "finetune: exit $?"; pack ;;
    gpt-standard)  # the GPT test alone at standard: node 1 compiles, node 2 (empty caches) loads, then warm
      timeout 150 $QT --cold 2 --warm 1 --out "$S/gpt-standard" -- python3 -m clustergate run --level standard \
        -k test_gpt_throughput --shared-dir "$S/shared-standard" >"$S/gpt-standard.txt" 2>&1
      say "gpt-standard: exit $?"; pack ;;
  esac
done
ls -la "$S"/shared-*/compiled >>"$LOG" 2>&1
pack
say "done: $OUT/fleet.tgz"
for f in "$S"/quick.txt "$S"/finetune.txt "$S"/standard.txt "$S"/standard-gpt-node2.txt "$S"/gpt-standard.txt; do
  [ -f "$f" ] && grep -E "^(cold|warm)[0-9]|^wall|kernels of|^  (wall|start|tests|start-up) " "$f" | head -40
done
