#!/bin/bash
# Day-2 node health check for a Slurm Epilog or Prolog: run clustergate on this node alone at
# --level quick and drain the node when it fails, with the reason taken from results.json:
#
#   $ scontrol show node gpu017 | grep Reason
#      Reason=clustergate reject: test_matmul_tflops[bf16]: matmul_bf16_tflops=512.3 TFLOPS, expected >= 700
#      [h100-sxm-80gb, rank 5 gpu017 gpu 5 serial 1650...] (report: /var/log/clustergate/gpu017/...) [root@...]
#
# An EXAMPLE to adapt. slurm.conf runs a small site file that sets the environment and execs this:
#
#   Epilog=/etc/slurm/epilog.d/clustergate.sh     # after each job: the next job never lands on a bad node
#   # or: Prolog=/etc/slurm/prolog.d/clustergate.sh with PrologFlags=Alloc (before each job, delays its start)
#
#   #!/bin/sh   (/etc/slurm/epilog.d/clustergate.sh)
#   export CLUSTERGATE_GPUS_PER_NODE=8 CLUSTERGATE_HEALTH_DIR=/var/log/clustergate
#   exec /shared/clustergate/launch/slurm/healthcheck.sh        # [pytest arguments]
#
# Arguments go to pytest (default: acceptance --level quick); -m "not multinode" is always added:
# the check sees this node only.
#
# slurmd runs it as root with SLURMD_NODENAME set; it drains that node with scontrol. Environment:
#   CLUSTERGATE_GPUS_PER_NODE    GPUs this node must have (default: nvidia-smi -L's count; 0 runs 1 CPU rank)
#   CLUSTERGATE_NPROC_PER_NODE   ranks (default: the GPU count)
#   CLUSTERGATE_HEALTH_DIR       reports of each check: DIR/<node>/<UTC time>/, with node.log (node.sh's
#                                output) beside results.json (default /var/tmp/clustergate-health)
#   CLUSTERGATE_HEALTH_TIMEOUT   seconds for the whole check (default 300); one that runs over drains the node
#   CLUSTERGATE_HEALTH_FAILED_STATUS  exit status after draining (default 0). In a Prolog, 1 makes Slurm
#                                requeue the job elsewhere (Slurm then also notes the prolog failure).
#   CLUSTERGATE_PYTHON           Python with torch and the suite's dependencies (default: python3)
#   TORCHINDUCTOR_CACHE_DIR      torch.compile's kernels, kept between checks so later ones compile from the
#                                cache (default: DIR/<node>/inductor-cache under CLUSTERGATE_HEALTH_DIR)
# Exit status: 0 when the node passed (or the failed status above after draining); 2 on bad settings.
set -uo pipefail
export PATH=${PATH:-/usr/sbin:/usr/bin:/sbin:/bin}  # slurmd gives prologs an almost empty environment

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)  # the checkout
py=${CLUSTERGATE_PYTHON:-python3}
node=${SLURMD_NODENAME:-}
[[ -n $node ]] || { echo "clustergate health: SLURMD_NODENAME is not set: run this as a Slurm Prolog or Epilog" >&2; exit 2; }

gpus=${CLUSTERGATE_GPUS_PER_NODE:-}
if [[ -z $gpus ]]; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
nproc=${CLUSTERGATE_NPROC_PER_NODE:-$gpus}
((nproc > 0)) || nproc=1  # no GPU: one CPU rank (the cpu profile)
limit=${CLUSTERGATE_HEALTH_TIMEOUT:-300}
report_dir=${CLUSTERGATE_HEALTH_DIR:-/var/tmp/clustergate-health}/$node/$(date -u +%Y%m%dT%H%M%SZ)
# The GPT test's compile is the quick level's largest cost; a cache kept beside the reports makes every check
# after the first load its kernels instead (slurmd gives each prolog a fresh environment, often a fresh /tmp).
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-${CLUSTERGATE_HEALTH_DIR:-/var/tmp/clustergate-health}/$node/inductor-cache}
if (($# == 0)); then
    set -- acceptance --level quick
fi

mkdir -p "$report_dir" || { echo "clustergate health: cannot create $report_dir" >&2; exit 2; }

start=$SECONDS
# node.sh alone on this node: its preflight, then torchrun --standalone. Its output goes to node.log.
CLUSTERGATE_NNODES=1 CLUSTERGATE_RDZV_ENDPOINT="" CLUSTERGATE_GPUS_PER_NODE=$gpus CLUSTERGATE_NPROC_PER_NODE=$nproc \
    CLUSTERGATE_REPORT_DIR=$report_dir CLUSTERGATE_PYTHON=$py \
    timeout --kill-after=30 "$limit" bash "$root/launch/node.sh" "$@" -m "not multinode" \
    >"$report_dir/node.log" 2>&1 </dev/null
status=$?
seconds=$((SECONDS - start))

if ((status == 0)); then
    echo "clustergate health: $node passed in ${seconds} s ($report_dir)"
    exit 0
fi
if ((status == 124 || status == 137)); then
    reason="clustergate: health check did not finish within $limit s"
else
    reason=$("$py" "$root/launch/health_reason.py" "$report_dir" --max-chars 200)
    reason=${reason:-"clustergate: health check exited $status"}
fi
reason="$reason (report: $report_dir)"
echo "clustergate health: draining $node after ${seconds} s: $reason" >&2
scontrol update nodename="$node" state=drain reason="$reason" ||
    echo "clustergate health: could not drain $node (scontrol exit $?)" >&2
exit "${CLUSTERGATE_HEALTH_FAILED_STATUS:-0}"
