# shellcheck shell=bash
# What every clustergate batch script does first, sourced by clustergate.sbatch and signoff.sbatch:
# check the job and its settings, and build the srun options of a step that runs launch/node.sh once
# per node. Not run on its own.
#
#   . "$checkout/launch/slurm/job.sh"  # sets root: the checkout this file is in
#   job_checks                  # sets gpus and py, exports CLUSTERGATE_GPUS_PER_NODE
#   node_step NODES REPORT_DIR  # sets the array step=(srun options); add --nodelist, --kill-on-bad-exit ...

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=launch/image.sh
. "$root/launch/image.sh"

fail() {
    echo "clustergate: $*" >&2
    exit 2
}

job_checks() {
    [[ -n ${SLURM_JOB_ID:-} ]] || fail "submit this with sbatch (SLURM_JOB_ID is not set)"
    [[ -n ${CLUSTERGATE_REPORT_DIR:-} ]] || fail "set CLUSTERGATE_REPORT_DIR to a directory every node mounts"
    # node.sh runs in the checkout: a path relative to where sbatch ran must not change meaning there
    CLUSTERGATE_REPORT_DIR=$(realpath -m "$CLUSTERGATE_REPORT_DIR")
    gpus=${CLUSTERGATE_GPUS_PER_NODE:-${SLURM_GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-}}}
    gpus=${gpus##*:}  # --gpus-per-node=h100:8 arrives as "h100:8"
    [[ $gpus =~ ^[0-9]+$ ]] || fail "how many GPUs per node? pass sbatch --gpus-per-node=G or set CLUSTERGATE_GPUS_PER_NODE"
    export CLUSTERGATE_GPUS_PER_NODE=$gpus
    if [[ -n ${CLUSTERGATE_STORE:-} ]]; then
        # The results store: the runs, merge and sign-off all run in the checkout (as the report directory).
        CLUSTERGATE_STORE=$(realpath -m "$CLUSTERGATE_STORE")
        [[ -d $(dirname "$CLUSTERGATE_STORE") ]] \
            || fail "CLUSTERGATE_STORE=$CLUSTERGATE_STORE: its directory does not exist (a path every node mounts)"
        export CLUSTERGATE_STORE
    fi
    py=${CLUSTERGATE_PYTHON:-python3}
    if [[ -z ${CLUSTERGATE_CONTAINER_IMAGE:-} && -n ${CLUSTERGATE_REGISTRY:-} ]]; then
        # The Dockerfile's image as pyxis takes it (launch/image.sh): this checkout's version, from the registry.
        CLUSTERGATE_CONTAINER_IMAGE=$(clustergate_enroot_image "$CLUSTERGATE_REGISTRY" CLUSTERGATE_REGISTRY 2>&1) \
            || fail "$CLUSTERGATE_CONTAINER_IMAGE"
    fi
}

# One task per node that may use every CPU of the node: torchrun's --numa-binding then places each
# rank near its GPU. Without --cpu-bind=none and the full CPU count, Slurm's task affinity would pin
# the agent and all its ranks to the one CPU a default task gets.
node_step() {
    local nodes=$1 reports=$2 mounts
    # --ntasks too: srun would otherwise take the job's SLURM_NTASKS, more tasks than a subset of nodes holds.
    step=(--nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 --cpu-bind=none
        --cpus-per-task="${SLURM_CPUS_ON_NODE:-1}")
    if [[ -n ${CLUSTERGATE_CONTAINER_IMAGE:-} ]]; then
        mounts="$root:$root,$reports:$reports"
        if [[ -n ${CLUSTERGATE_SHARED_DIR:-} ]]; then
            mounts+=",$CLUSTERGATE_SHARED_DIR:$CLUSTERGATE_SHARED_DIR"
        fi
        if [[ -n ${CLUSTERGATE_NCCL_ENV:-} ]]; then
            mounts+=",$CLUSTERGATE_NCCL_ENV:$CLUSTERGATE_NCCL_ENV"
        fi
        if [[ -n ${CLUSTERGATE_STORE:-} ]]; then
            mounts+=",$(dirname "$CLUSTERGATE_STORE"):$(dirname "$CLUSTERGATE_STORE")"
        fi
        mounts+=${CLUSTERGATE_CONTAINER_MOUNTS:+,$CLUSTERGATE_CONTAINER_MOUNTS}
        step+=(--container-image="$CLUSTERGATE_CONTAINER_IMAGE" --container-mounts="$mounts"
            --container-workdir="$root")
    fi
}

# The checkout's clustergate command (merge, signoff), whatever directory sbatch ran in.
report_cli() {
    (cd "$root" && "$py" -m clustergate "$@")
}

# An option of pytest's arguments as merge and signoff take it: option_of NAME ARRAY "$@" sets the array named
# ARRAY to (--NAME VALUE) from --NAME VALUE or --NAME=VALUE (the last one given), else to ().
# shellcheck disable=SC2034  # found names the caller's array: what is set here is read there
option_of() {
    local name=$1
    local -n found=$2
    shift 2
    found=()
    while (($# > 0)); do
        case $1 in
            "--$name") (($# > 1)) && found=("--$name" "$2"); shift ;;
            "--$name="*) found=("--$name" "${1#--"$name"=}") ;;
        esac
        shift
    done
}

# The --thresholds of pytest's arguments ("$@"): merge and signoff hold every run to the thresholds it was
# started with. Sets the array thresholds_args (empty: the shipped file). Paths resolve alike: node.sh and
# report_cli both run in the checkout.
thresholds_option() {
    option_of thresholds thresholds_args "$@"
}

# The --level of pytest's arguments ("$@"): the level every node run must have run at, as merge takes it (a
# node that ran less is excluded as partial). Sets the array level_args (empty: merge's default, standard).
level_option() {
    option_of level level_args "$@"
}

# After a step that ended non-zero: name the node that failed first, in this output and in the
# step's results.json / report.html (launch/first_failure.py; silent when the run finished normally).
name_first_failure() {
    if [[ -d $1 ]]; then
        "$py" "$root/launch/first_failure.py" "$1" --annotate || true
    fi
}
