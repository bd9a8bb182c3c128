#!/bin/bash
# Day-2 node health check for a Slurm Prolog, Epilog or HealthCheckProgram: check this node alone, drain it when
# it fails, with the reason the check gives, and resume a node it drained once it passes again.
#
# Two tiers (CLUSTERGATE_HEALTH_TIER):
#   health (default)  `clustergate health`: the node's state from NVML and sysfs in seconds, judged by the same
#                     profile as a run (no torch, no torchrun; within LBNL NHC's 30 s and a HealthCheckProgram's 60)
#   quick             the acceptance suite at --level quick under torchrun: measures every GPU (about a minute)
#
#   $ scontrol show node gpu017 | grep Reason
#      Reason=clustergate: health: 1 failure: gpu017 gpu 3 serial 1652923017303: ecc_mode = disabled (expected
#      enabled): ECC is disabled (...) (report: /var/lib/clustergate/health/gpu017/20261125T...) [root@...]
#
# An EXAMPLE to adapt. slurm.conf runs a small site file that sets the environment and execs this:
#
#   Prolog=/etc/slurm/prolog.d/clustergate.sh     # before each job (with PrologFlags=Alloc): seconds at the health tier
#   # or: Epilog=/etc/slurm/epilog.d/clustergate.sh   (after each job: the next job never lands on a bad node)
#   HealthCheckProgram=/etc/slurm/clustergate-recheck.sh   # the same with CLUSTERGATE_HEALTH_RECHECK=1
#
#   #!/bin/sh   (/etc/slurm/prolog.d/clustergate.sh)
#   export CLUSTERGATE_GPUS_PER_NODE=8        # reports: /var/lib/clustergate/health (CLUSTERGATE_HEALTH_DIR)
#   exec /shared/clustergate/launch/slurm/healthcheck.sh        # [arguments]
#
# Arguments go to the tier's command: `clustergate health` options (e.g. --profile h100-sxm-80gb, --skip CHECK)
# for the health tier; pytest's for the quick tier (default: acceptance --level quick), where -m "not multinode"
# is always added: the check sees this node only.
#
# slurmd runs it as root with SLURMD_NODENAME set; it drains that node with scontrol. Environment:
#   CLUSTERGATE_HEALTH_TIER      health (default) or quick
#   CLUSTERGATE_GPUS_PER_NODE    GPUs this node must have. health: a value above 0 makes it a GPU node whatever NVML
#                                says (workloads/node/gpu_presence.py); quick: the ranks (default: nvidia-smi -L's
#                                count; 0 runs 1 CPU rank)
#   CLUSTERGATE_NPROC_PER_NODE   quick: ranks (default: the GPU count)
#   CLUSTERGATE_HEALTH_DIR       reports of each check: DIR/<node>/<UTC time>.XXXXXX/ (a new directory each time,
#                                mktemp -d): health.json and health.log (health), results.json and node.log (quick)
#                                (default /var/lib/clustergate/health as root, else
#                                ${XDG_STATE_HOME:-~/.local/state}/clustergate/health). Refused (exit 2) unless
#                                it and every parent belong to this user or root and no other user can write it
#                                (launch/safe_dir.py): never a shared /tmp path another user could make first.
#   CLUSTERGATE_HEALTH_TIMEOUT   seconds for the whole check (default 25 for health, 300 for quick); one that runs
#                                over drains the node
#   CLUSTERGATE_HEALTH_FAILED_STATUS  exit status after draining (default 0). In a Prolog, 1 makes Slurm
#                                requeue the job elsewhere (Slurm then also notes the prolog failure).
#   CLUSTERGATE_PYTHON           Python with clustergate's dependencies (torch for quick) (default: python3)
#   TORCHINDUCTOR_CACHE_DIR      quick: torch.compile's kernels, kept between checks so later ones compile from the
#                                cache (default: DIR/<node>/inductor-cache under CLUSTERGATE_HEALTH_DIR; checked
#                                as that directory is: torch loads pickles from it)
#   CLUSTERGATE_HEALTH_RECHECK   1: the HealthCheckProgram mode. health: checks every node, whatever its state
#                                (a node running a job is not failed for that job's processes on its GPUs: the
#                                foreign_processes check is left out there), drains a failing one, resumes one it
#                                drained. quick: does nothing (exit 0 at once) unless this node is drained by
#                                clustergate (reason "clustergate: ...") and idle; then starts the check detached
#                                (slurmd kills a HealthCheckProgram after 60 s) and returns.
#
# Drain reasons start with "clustergate: ". A node that passes is resumed when, and only when, it is drained with
# a reason that starts so: one an admin drained for anything else stays drained, with the admin's reason (a check
# that fails there does not drain it again). A GPU node whose driver or CUDA is
# broken fails either tier, so it is drained and never resumed by this script.
#
# Exit status: 0 when the node passed (or the failed status above after draining); 2 on bad settings.
set -uo pipefail
export PATH=${PATH:-/usr/sbin:/usr/bin:/sbin:/bin}  # slurmd gives prologs an almost empty environment

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)  # the checkout
py=${CLUSTERGATE_PYTHON:-python3}
node=${SLURMD_NODENAME:-}
prefix="clustergate: "  # every drain reason this script writes starts so; it resumes only those
fail() { echo "clustergate health: $*" >&2; exit 2; }
[[ -n $node ]] || fail "SLURMD_NODENAME is not set: run this as a Slurm Prolog, Epilog or HealthCheckProgram"
[[ $node =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || fail "SLURMD_NODENAME='$node' is not a node name"

# (state, reason) of this node as scontrol shows them: "IDLE+DRAIN", "clustergate: ... [root@2026-...]".
node_state() {
    local info
    info=$(scontrol show node "$node" 2>/dev/null) || info=""
    state=$(sed -n 's/.*[[:space:]]State=\([^[:space:]]*\).*/\1/p' <<<"$info" | head -n1)
    reason=$(sed -n 's/^[[:space:]]*Reason=//p' <<<"$info" | head -n1)
}
drained_by_us() { [[ $state == *DRAIN* && $reason == "$prefix"* ]]; }

if [[ $EUID == 0 ]]; then
    default_dir=/var/lib/clustergate/health
else
    default_dir=${XDG_STATE_HOME:-${HOME:?HOME is not set}/.local/state}/clustergate/health
fi
base=${CLUSTERGATE_HEALTH_DIR:-$default_dir}
# This node's directory, and the compile cache, only where no other user can plant a file or a symlink.
node_dir=$("$py" "$root/launch/safe_dir.py" --create --name CLUSTERGATE_HEALTH_DIR "$base/$node") || exit 2

tier=${CLUSTERGATE_HEALTH_TIER:-health}
[[ $tier == health || $tier == quick ]] || fail "CLUSTERGATE_HEALTH_TIER='$tier': health (the default) or quick"
health_args=()
if [[ $tier == health && ${CLUSTERGATE_HEALTH_RECHECK:-} == 1 ]]; then
    # HealthCheckProgram at the health tier: seconds, so every node is checked here and now. A node running a job
    # has that job's processes on its GPUs: they are not another job's.
    node_state
    if [[ $state == *DRAIN* ]] && ! drained_by_us; then
        exit 0  # drained by someone else: theirs to give back, and their reason stays
    fi
    if [[ $state == *ALLOC* || $state == *MIX* || $state == *COMPLETING* ]]; then
        health_args=(--skip foreign_processes)
    fi
elif [[ ${CLUSTERGATE_HEALTH_RECHECK:-} == 1 ]]; then
    # HealthCheckProgram at the quick tier: slurmd runs this every HealthCheckInterval on every node and kills it
    # after 60 s. Only a node we drained, now idle (no job to disturb: a drained node gets none), is checked again,
    # detached.
    node_state
    if drained_by_us && [[ $state == IDLE* ]]; then
        CLUSTERGATE_HEALTH_RECHECK=detached setsid -f "$BASH" "${BASH_SOURCE[0]}" "$@" \
            </dev/null >>"$node_dir/recheck.log" 2>&1
    fi
    exit 0
fi
if [[ ${CLUSTERGATE_HEALTH_RECHECK:-} == detached ]]; then
    exec 9>>"$node_dir/recheck.lock"
    flock -n 9 || exit 0  # the previous recheck is still running
fi

report_dir=$(mktemp -d "$node_dir/$(date -u +%Y%m%dT%H%M%SZ).XXXXXX") || fail "cannot create a directory in $node_dir"

start=$SECONDS
if [[ $tier == health ]]; then
    limit=${CLUSTERGATE_HEALTH_TIMEOUT:-25}
    # clustergate health from this checkout: NVML and files only. Its output goes to health.log, its verdict to
    # health.json (the drain reason's source).
    (cd "$root" && timeout --kill-after=5 "$limit" "$py" -m clustergate health --report-dir "$report_dir" \
        ${health_args[@]+"${health_args[@]}"} "$@") >"$report_dir/health.log" 2>&1 </dev/null
    status=$?
else
    gpus=${CLUSTERGATE_GPUS_PER_NODE:-}
    if [[ -z $gpus ]]; then
        gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
    fi
    nproc=${CLUSTERGATE_NPROC_PER_NODE:-$gpus}
    ((nproc > 0)) || nproc=1  # no GPU: one CPU rank (the cpu profile)
    limit=${CLUSTERGATE_HEALTH_TIMEOUT:-300}
    # The GPT test's compile is the quick level's largest cost; a cache kept beside the reports makes every check
    # after the first load its kernels instead (slurmd gives each prolog a fresh environment, often a fresh /tmp).
    TORCHINDUCTOR_CACHE_DIR=$("$py" "$root/launch/safe_dir.py" --create --name TORCHINDUCTOR_CACHE_DIR \
        "${TORCHINDUCTOR_CACHE_DIR:-$node_dir/inductor-cache}") || { rm -rf "$report_dir"; exit 2; }
    export TORCHINDUCTOR_CACHE_DIR
    if (($# == 0)); then
        set -- acceptance --level quick
    fi
    # node.sh alone on this node: its preflight, then torchrun --standalone. Its output goes to node.log.
    CLUSTERGATE_NNODES=1 CLUSTERGATE_RDZV_ENDPOINT="" CLUSTERGATE_GPUS_PER_NODE=$gpus \
        CLUSTERGATE_NPROC_PER_NODE=$nproc CLUSTERGATE_REPORT_DIR=$report_dir CLUSTERGATE_PYTHON=$py \
        timeout --kill-after=30 "$limit" bash "$root/launch/node.sh" "$@" -m "not multinode" \
        >"$report_dir/node.log" 2>&1 </dev/null
    status=$?
fi
seconds=$((SECONDS - start))
narrowed=""
# A quick tier the site narrowed (-k, -m in its arguments) ends partial, status 1, when all it ran passed: healthy.
if ((status == 1)) && [[ $tier == quick ]] && "$py" "$root/launch/health_reason.py" "$report_dir" >/dev/null 2>&1
then
    status=0 narrowed=" (partial: the selection its arguments narrowed, all passed)"
fi

if ((status == 0)); then
    echo "clustergate health: $node passed in ${seconds} s${narrowed} ($report_dir)"
    node_state  # now, not before the check: an admin may have drained it meanwhile, for another reason
    if drained_by_us; then
        if scontrol update nodename="$node" state=resume; then
            echo "clustergate health: resumed $node (it was drained: $reason)"
        else
            echo "clustergate health: could not resume $node (scontrol exit $?)" >&2
        fi
    fi
    exit 0
fi
if ((status == 124 || status == 137)); then
    reason="${prefix}health check did not finish within $limit s"
else
    reason=$("$py" "$root/launch/health_reason.py" "$report_dir" --max-chars 200)
    reason=${reason:-"${prefix}health check exited $status"}
fi
why="$reason (report: $report_dir)"
node_state  # now: a node someone else drained keeps their reason (this script would later resume its own)
if [[ $state == *DRAIN* ]] && ! drained_by_us; then
    echo "clustergate health: $node failed after ${seconds} s: $why; it is drained already ($reason): left so" >&2
    exit "${CLUSTERGATE_HEALTH_FAILED_STATUS:-0}"
fi
echo "clustergate health: draining $node after ${seconds} s: $why" >&2
scontrol update nodename="$node" state=drain reason="$why" ||
    echo "clustergate health: could not drain $node (scontrol exit $?)" >&2
exit "${CLUSTERGATE_HEALTH_FAILED_STATUS:-0}"
