#!/usr/bin/env bash
# One node of a clustergate job: check the node, then start its torchrun agent (c10d rendezvous).
#
# Both launchers run this once per node (Slurm: srun --ntasks-per-node=1, see slurm/clustergate.sbatch;
# Kubernetes: one pod per node, see k8s/). Everything comes from the environment; nothing is edited here.
#
#   CLUSTERGATE_NNODES          nodes in the job (required)
#   CLUSTERGATE_GPUS_PER_NODE   GPUs every node must have; 0 runs CPU ranks (required)
#   CLUSTERGATE_NPROC_PER_NODE  ranks per node (default: CLUSTERGATE_GPUS_PER_NODE)
#   CLUSTERGATE_RDZV_ENDPOINT   HOST:PORT of the rendezvous, on the job's first node (required, except
#                               with CLUSTERGATE_NNODES=1: then this node runs alone, torchrun --standalone)
#   CLUSTERGATE_RDZV_ID         an id unique to this job, the same on every node (required with an endpoint)
#   CLUSTERGATE_NODE_INDEX      0 on the node that hosts the rendezvous store (default: SLURM_NODEID,
#                               else JOB_COMPLETION_INDEX; unset: torchrun guesses from the host name)
#   CLUSTERGATE_RDZV_TIMEOUT    seconds every node may take to join (torchrun's join_timeout; default 600)
#   CLUSTERGATE_RDZV_READ_TIMEOUT  seconds for one rendezvous store operation (read_timeout; default 60)
#   CLUSTERGATE_REPORT_DIR      where results.json and the report go; a shared path (required). "{node}"
#                               in it becomes this node's name (each node alone: REPORTS/RUN/nodes/{node})
#   CLUSTERGATE_SHARED_DIR      directory of the shared-filesystem test (default: CLUSTERGATE_REPORT_DIR)
#   CLUSTERGATE_NCCL_ENV        optional KEY=VALUE file sourced before torchrun (slurm/nccl-ib.env.example)
#   CLUSTERGATE_NUMA_BINDING    torchrun --numa-binding mode with GPUs (default: node; none: no binding)
#   CLUSTERGATE_PYTHON          Python with torch and the suite's dependencies (default: python3)
#   CLUSTERGATE_NODE_NAME       this node's name in messages, reports and results (default: Slurm's
#                               SLURMD_NODENAME, else the host name; the rule is workloads/node/name.py)
#   CLUSTERGATE_RUN_ID          the cluster run recorded in results.json: RUN_ID where the report directory is
#                               REPORTS/RUN_ID/nodes/{node} or REPORTS/RUN_ID/fabric, else this variable, else
#                               the report directory's name
#
# Arguments go to pytest (default: acceptance), e.g. `-m multinode --level quick`. The suite is the checkout's where
# acceptance/ and conftest.py are beside launch/; else (the container image: launch/ alone beside an installed
# clustergate) the installed one, run as `clustergate run` runs it, and `acceptance` names that package.
# A preflight or torchrun that ends non-zero leaves REPORT_DIR/node-exits/NODE.json (node, node_index,
# stage, status, time): launch/first_failure.py names the node that failed first from these. On a GPU node
# `nvidia-smi -q` is captured into REPORT_DIR/nvidia-smi-q.txt after the run (for an evidence bundle).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here/.."  # the checkout, or launch/'s parent in the container image (/opt/clustergate)
py=${CLUSTERGATE_PYTHON:-python3}
# One naming rule for every report, message and directory (several Slurm nodes may share a host name).
node=$("$py" -c 'from workloads.node.name import node_name; print(node_name())' 2>/dev/null || true)
node=${node:-$(hostname)}

fail() {
    echo "clustergate FAILED on $node: $*" >&2
    exit 2
}
need() {
    [[ -n ${!1:-} ]] || fail "$1 is not set (see the top of launch/node.sh)"
}
# The record below, written by a JSON library: a node name may hold any character (CLUSTERGATE_NODE_NAME).
# shellcheck disable=SC2016  # Python, not shell
# Written to a new temporary file, then renamed over the name: a link planted there is replaced, never followed.
write_exit='import json, os, re, sys, tempfile
node, index, stage, status, when, where = sys.argv[1:]
name = re.sub(r"[^A-Za-z0-9._-]", "_", node) or "_"  # one file per node, never outside where
fd, tmp = tempfile.mkstemp(dir=where, prefix=f".{name}.", suffix=".tmp")
with os.fdopen(fd, "w") as f:
    json.dump({"node": node, "node_index": index, "stage": stage, "status": int(status), "time": float(when)}, f)
    f.write("\n")
os.replace(tmp, f"{where}/{name}.json")'
record_exit() {  # STAGE STATUS: this node's ending, for launch/first_failure.py
    local when
    when=$(date +%s.%N)  # now, not after Python has started: first_failure.py orders nodes by it
    if mkdir -p "$report_dir/node-exits" 2>/dev/null; then
        "$py" -c "$write_exit" "$node" "$node_index" "$1" "$2" "$when" "$report_dir/node-exits" || true
    fi
}

need CLUSTERGATE_NNODES
need CLUSTERGATE_GPUS_PER_NODE
need CLUSTERGATE_REPORT_DIR
standalone=0
if [[ $CLUSTERGATE_NNODES == 1 && -z ${CLUSTERGATE_RDZV_ENDPOINT:-} ]]; then
    standalone=1  # this node alone (the sign-off's node phase, a health check): no rendezvous to find
else
    need CLUSTERGATE_RDZV_ENDPOINT
    need CLUSTERGATE_RDZV_ID
fi
gpus=$CLUSTERGATE_GPUS_PER_NODE
[[ $gpus =~ ^[0-9]+$ ]] || fail "CLUSTERGATE_GPUS_PER_NODE is '$gpus', not a number"
nproc=${CLUSTERGATE_NPROC_PER_NODE:-$gpus}
[[ $nproc =~ ^[1-9][0-9]*$ ]] || fail "ranks per node is '$nproc': set CLUSTERGATE_GPUS_PER_NODE (or CLUSTERGATE_NPROC_PER_NODE for CPU ranks)"
node_index=${CLUSTERGATE_NODE_INDEX:-${SLURM_NODEID:-${JOB_COMPLETION_INDEX:-}}}
join_timeout=${CLUSTERGATE_RDZV_TIMEOUT:-600}
read_timeout=${CLUSTERGATE_RDZV_READ_TIMEOUT:-60}
report_dir=${CLUSTERGATE_REPORT_DIR//\{node\}/$node}
export CLUSTERGATE_SHARED_DIR=${CLUSTERGATE_SHARED_DIR:-$report_dir}
# The cluster run this run is a part of, recorded in its results.json: merge and sign-off take only the parts
# of their own run. It is the place of the report directory (REPORTS/RUN_ID/nodes/NODE, REPORTS/RUN_ID/fabric);
# elsewhere CLUSTERGATE_RUN_ID, else the report directory's own name.
place=${report_dir%/}
case $place in
    */nodes/*) run_id=$(basename "$(dirname "$(dirname "$place")")") ;;
    */fabric) run_id=$(basename "$(dirname "$place")") ;;
    *) run_id=${CLUSTERGATE_RUN_ID:-$(basename "$place")} ;;
esac
export CLUSTERGATE_RUN_ID=$run_id

if [[ -n ${CLUSTERGATE_NCCL_ENV:-} ]]; then
    [[ -r $CLUSTERGATE_NCCL_ENV ]] || fail "CLUSTERGATE_NCCL_ENV=$CLUSTERGATE_NCCL_ENV is not a readable file"
    set -a
    # shellcheck source=/dev/null
    . "$CLUSTERGATE_NCCL_ENV"
    set +a
fi

if ! "$py" launch/preflight.py --gpus "$gpus" --report-dir "$report_dir" --shared-dir "$CLUSTERGATE_SHARED_DIR" \
    --rdzv-endpoint "${CLUSTERGATE_RDZV_ENDPOINT:-}" --node-index "$node_index" --timeout "$join_timeout"; then
    record_exit preflight 2
    exit 2
fi

if ((standalone)); then
    rendezvous=(--standalone)  # a free local port: nodes sharing one machine (tests) never collide
else
    rdzv_conf="join_timeout=$join_timeout,read_timeout=$read_timeout"
    if [[ $node_index == 0 ]]; then
        rdzv_conf+=",is_host=1"  # host the store here even where the endpoint name is not this host's own name
    elif [[ -n $node_index ]]; then
        rdzv_conf+=",is_host=0"
    fi
    rendezvous=(--nnodes="$CLUSTERGATE_NNODES" --rdzv-backend=c10d --rdzv-endpoint="$CLUSTERGATE_RDZV_ENDPOINT"
        --rdzv-id="$CLUSTERGATE_RDZV_ID" --rdzv-conf="$rdzv_conf")
fi

launcher=("$py" -m torch.distributed.run)
binding=${CLUSTERGATE_NUMA_BINDING:-node}
if ((gpus > 0)) && [[ $binding != none ]]; then
    if ! "${launcher[@]}" --help 2>/dev/null | grep -q -- '--numa-binding'; then
        echo "clustergate on $node: this torchrun has no --numa-binding (torch < 2.8): ranks run unbound" >&2
    elif ! command -v numactl >/dev/null; then
        echo "clustergate on $node: numactl not found: torchrun --numa-binding needs it; ranks run unbound" >&2
    else
        launcher+=(--numa-binding="$binding")
    fi
fi

if (($# == 0)); then
    set -- acceptance
fi
suite=()
if [[ ! -d acceptance || ! -f conftest.py ]]; then
    # The installed suite with clustergate run's pytest settings, plugins and environment (clustergate.run.launch.command);
    # --pyargs: "acceptance" among the arguments names the installed package.
    # shellcheck disable=SC2016  # Python, not shell
    installed='from clustergate.run.launch.command import RUN_ENV, RUN_INI, RUN_PLUGINS, acceptance_dir
print(*[f"{k}={v}" for k, v in RUN_ENV.items()], "--", "-c", RUN_INI, "--rootdir", acceptance_dir().parent,
      *[a for p in RUN_PLUGINS for a in ("-p", p)], "--pyargs", sep="\n")'
    said=$("$py" -c "$installed" 2>&1) \
        || fail "no acceptance/ beside launch/, and $py has no clustergate installed to run instead (${said##*$'\n'})"
    mapfile -t lines <<< "$said"
    for line in "${lines[@]}"; do
        if ((${#suite[@]})) || [[ $line == -- ]]; then
            suite+=("$line")
        else
            export "${line?}"
        fi
    done
    suite=("${suite[@]:1}")
fi
status=0
"${launcher[@]}" "${rendezvous[@]}" --nproc-per-node="$nproc" --max-restarts=0 \
    -m pytest "${suite[@]}" --report-dir "$report_dir" "$@" || status=$?

# nvidia-smi -q as the run left the GPUs: what a vendor ticket asks for first (merge puts it in an excluded node's
# evidence bundle). After the run, so that its next run moves it aside with the rest of this run's outputs; whole or
# not at all (a private temporary file renamed over the name); bounded, as a GPU off the bus can hang it.
if ((gpus > 0)) && [[ -d $report_dir ]] && command -v nvidia-smi >/dev/null; then
    if smi=$(mktemp "$report_dir/.nvidia-smi-q.XXXXXX" 2>/dev/null); then
        chmod "$(umask -S | tr -d x)" "$smi" || true  # as any output: the user's umask, not mktemp's 0600
        timeout 120 nvidia-smi -q > "$smi" 2>&1 || echo "(nvidia-smi -q exited $?)" >> "$smi"
        mv -f "$smi" "$report_dir/nvidia-smi-q.txt" || rm -f "$smi"
    fi
fi

if ((status != 0)); then
    where="$node${node_index:+ (node index $node_index)}"
    record_exit torchrun "$status"
    if [[ ! -e $report_dir/progress.jsonl ]]; then
        # Rank 0 writes progress.jsonl as soon as pytest starts: without it the job never got that far.
        if ((standalone)); then
            echo "clustergate FAILED on $where: torchrun exited $status before pytest started (see above)" >&2
        else
            echo "clustergate FAILED on $where: torchrun exited $status" \
                "before pytest started. A RendezvousTimeoutError above means not all $CLUSTERGATE_NNODES nodes" \
                "joined $CLUSTERGATE_RDZV_ENDPOINT (id $CLUSTERGATE_RDZV_ID) within ${join_timeout} s; a" \
                "RendezvousConnectionError means the endpoint did not answer within ${read_timeout} s." >&2
        fi
    else
        # Every node of a rejected run ends here too: the verdict, not this line, says what failed.
        echo "clustergate on $where: torchrun exited $status; the verdict and reasons are in" \
            "$report_dir/results.json (report.html beside it)" >&2
    fi
fi
exit "$status"
