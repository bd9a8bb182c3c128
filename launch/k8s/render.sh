#!/usr/bin/env bash
# Fill in the ${CG_...} placeholders of a clustergate manifest and print it, ready for kubectl:
#
#   CG_NODES=2 CG_GPUS_PER_NODE=8 CG_REGISTRY=ghcr.io/owner \
#       launch/k8s/render.sh [clustergate.yaml|reports-pvc.yaml] | kubectl apply -f -
#
# A cluster signed off in phases (launch/README.md, "Signing off a cluster"): one command per phase,
# all under /reports/<CG_RUN_ID>/ on the reports volume:
#   CG_PHASE=node    CG_RUN_ID=r0412 CG_NODES=16 CG_REGISTRY=... render.sh | kubectl apply -f -   # node-phase.yaml
#   CG_PHASE=merge   CG_RUN_ID=r0412 CG_REGISTRY=... render.sh | kubectl apply -f -               # merge-phase.yaml
#   CG_PHASE=fabric  CG_RUN_ID=r0412 CG_REGISTRY=... CG_HOSTS="$(kubectl logs job/cg-r0412-merge -c accepted-hosts)" \
#       render.sh | kubectl apply -f -                                                          # clustergate.yaml
#   CG_PHASE=signoff CG_RUN_ID=r0412 CG_REGISTRY=... render.sh | kubectl apply -f -               # signoff-phase.yaml
#
# Parameters (environment; defaults in brackets):
#   CG_PHASE           node | merge | fabric | signoff; empty: one job over every node (clustergate.yaml) []
#   CG_RUN_ID          the run's name, the directory /reports/<CG_RUN_ID>/ (required with CG_PHASE)
#   CG_HOSTS           fabric: the Kubernetes node names to run on, one per line or separated by spaces or
#                      commas (merge's accepted-hosts.txt); CG_NODES becomes their count (required)
#   CG_EXPECT_HOSTS    merge: the hosts that should have a result, a Slurm hostlist (node[001-016]) or a
#                      file on the reports volume (/reports/...) []
#   CG_LEVEL           merge: the level the site requires of every node run: a node that ran at a lower one is
#                      excluded as partial (quick, standard or extended) [standard]
#   CG_THRESHOLDS      merge and signoff: the thresholds file the node and fabric phases ran with, in the image
#                      or under /reports (pass the same file with --thresholds in CG_PYTEST_ARGS) [the shipped one]
#   CG_STORE           the results store, a file on the reports volume (/reports/clustergate.db): every phase's run
#                      judges drift against it and is recorded into it, and so are the merge and the sign-off
#                      (docs/cluster-signoff.md: "Running clustergate over a cluster's life") []
#   CG_REPORT_DIR      where the job's reports go [/reports/<job>-<job uid>; fabric: /reports/<run>/fabric]
#   CG_NAME            Job and Service name, also the pods' DNS subdomain [clustergate; with CG_PHASE:
#                      cg-<run>-<phase>]
#   CG_NODES           pods = nodes [2]
#   CG_GPUS_PER_NODE   nvidia.com/gpu per pod, and torchrun ranks per pod [8]
#   CG_REGISTRY        the registry the image was pushed to (README, "Container image"), e.g. ghcr.io/owner: the
#                      image is then CG_REGISTRY/clustergate:VERSION, this checkout's version (launch/image.sh) []
#   CG_IMAGE           the image: clustergate installed, launch/ at CG_WORKDIR, a user that is not root for the
#                      containers that only read (the Dockerfile's) [CG_REGISTRY/clustergate:VERSION; one of the
#                      two is required]
#   CG_WORKDIR         launch/'s parent inside the image [/opt/clustergate]
#   CG_PYTEST_ARGS     pytest arguments, plain words only [acceptance; fabric: acceptance -m multinode]
#   CG_RDMA_RESOURCE   RDMA device resource, e.g. rdma/ib or rdma/rdma_shared_device_a; empty: none []
#   CG_RDMA_COUNT      how many of it per pod [1]
#   CG_RDZV_PORT       rendezvous port on pod 0 [29500]
#   CG_RDZV_TIMEOUT    seconds every pod may take to join (image pulls count) [900]
#   CG_DEADLINE_S      the Job's activeDeadlineSeconds [10800]
#   CG_PVC             PersistentVolumeClaim for /reports [clustergate-reports]
#   CG_SHARED_DIR      directory of the shared-filesystem test [/reports]
#   CG_NCCL_CONFIGMAP  ConfigMap of NCCL_* variables, used if it exists [clustergate-nccl]
#   CG_SHM_SIZE        size of /dev/shm [64Gi]
#   CG_STORAGE_CLASS   storage class of the PVC (ReadWriteMany); empty: the cluster default []
#   CG_PVC_SIZE        size of the PVC [100Gi]
#   CG_NODE_SELECTOR   the GPU pods' nodeSelector, KEY=VALUE[,KEY=VALUE...], e.g. nvidia.com/gpu.present=true []
#   CG_TOLERATIONS     taints the pods tolerate, KEY[=VALUE][:EFFECT][,...], e.g. nvidia.com/gpu:NoSchedule;
#                      without =VALUE any value (Exists), without :EFFECT every effect (the merge and sign-off
#                      pods too, so that they find a node where every node is a tainted GPU node) []. The node
#                      phase also tolerates clustergate.io/excluded:NoSchedule: a node excluded before is tested again.
#   CG_LABEL_NODES     merge: 1 labels every node with its result after the merge (clustergate.io/verdict=accept
#                      or excluded, clustergate.io/run=<run>, the reason in annotation clustergate.io/reason) and
#                      taints the excluded ones (clustergate.io/excluded=<run>:NoSchedule; an accepted node loses
#                      that taint), and renders the RBAC it needs: a ServiceAccount, a ClusterRole that may only
#                      get and patch nodes, and their binding [0]
#   CG_NAMESPACE       the namespace the Jobs are applied in; required with CG_LABEL_NODES=1 (the binding names
#                      it) []
#
# Every value is checked before anything is printed (one error naming the variable, exit 2): names, paths,
# the image, sizes and pytest's words may hold only the characters their kind allows, so no value can add
# YAML or shell to the manifest (string values are also quoted in the YAML).
# A line ending in "# only if CG_X" is left out when CG_X is empty.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fail() { echo "render.sh: $*" >&2; exit 2; }
# shellcheck source=launch/image.sh
. "$here/../image.sh"
# check VAR PATTERN WHAT: VAR's value matches PATTERN (bash ERE, whole value), else one error naming VAR.
check() {
    [[ ${!1} =~ $2 ]] || fail "$1=${!1@Q} is not $3"
}
dns_label='^[a-z]([a-z0-9-]{0,50}[a-z0-9])?$'
dns_subdomain='^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$'
abs_path='^/[A-Za-z0-9._/-]*$'
image_ref='^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$'
quantity='^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$'
label_key='([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?'
label_value='([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?'

export CG_PHASE=${CG_PHASE:-}
export CG_RUN_ID=${CG_RUN_ID:-}
export CG_HOSTS=${CG_HOSTS:-}
export CG_HOSTS_JSON=""
export CG_EXPECT_HOSTS=${CG_EXPECT_HOSTS:-}
export CG_EXPECT_ARGS=""
export CG_THRESHOLDS_ARGS=""
export CG_LEVEL_ARGS=""
export CG_STORE=${CG_STORE:-}
export CG_STORE_ARGS=""
case $CG_PHASE in
    "") default_manifest=clustergate.yaml ;;
    node) default_manifest=node-phase.yaml ;;
    merge) default_manifest=merge-phase.yaml ;;
    fabric) default_manifest=clustergate.yaml ;;
    signoff) default_manifest=signoff-phase.yaml ;;
    *) fail "CG_PHASE=${CG_PHASE@Q}: choose node, merge, fabric or signoff (or leave it empty for one job)" ;;
esac
if [[ -n $CG_PHASE ]]; then
    # The run's name is a directory and part of every Job's name: DNS label characters only.
    [[ $CG_RUN_ID =~ ^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$ ]] \
        || fail "CG_PHASE=$CG_PHASE needs CG_RUN_ID, lower-case letters, digits and '-' (got ${CG_RUN_ID@Q})"
    export CG_NAME=${CG_NAME:-cg-$CG_RUN_ID-$CG_PHASE}
fi
if [[ $CG_PHASE == fabric ]]; then
    read -r -a hosts <<< "$(tr ',\n' '  ' <<< "$CG_HOSTS")"
    ((${#hosts[@]} > 0)) || fail "CG_PHASE=fabric needs CG_HOSTS: the accepted hosts, e.g." \
        "CG_HOSTS=\"\$(kubectl logs job/cg-$CG_RUN_ID-merge -c accepted-hosts)\""
    for h in "${hosts[@]}"; do
        [[ $h =~ ^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$ ]] \
            || fail "CG_HOSTS: ${h@Q} is not a Kubernetes node name (give accepted-hosts.txt's names, not a hostlist)"
    done
    CG_HOSTS_JSON="[$(printf '"%s",' "${hosts[@]}" | sed 's/,$//')]"
    export CG_NODES=${#hosts[@]}
    export CG_REPORT_DIR=${CG_REPORT_DIR:-/reports/$CG_RUN_ID/fabric}
    export CG_PYTEST_ARGS=${CG_PYTEST_ARGS:-acceptance -m multinode}
elif [[ -n $CG_HOSTS ]]; then
    fail "CG_HOSTS is for CG_PHASE=fabric"
fi
if [[ -n $CG_EXPECT_HOSTS ]]; then
    [[ $CG_PHASE == merge ]] || fail "CG_EXPECT_HOSTS is for CG_PHASE=merge"
    hostlist_chars='^[][A-Za-z0-9._/,-]+$'  # a bracket expression: ']' first and '[' are literal
    [[ $CG_EXPECT_HOSTS =~ $hostlist_chars ]] \
        || fail "CG_EXPECT_HOSTS=${CG_EXPECT_HOSTS@Q}: give a hostlist (node[001-016]) or a file under /reports"
    CG_EXPECT_ARGS="--expect-hosts '$CG_EXPECT_HOSTS'"
fi
if [[ -n ${CG_THRESHOLDS:-} ]]; then
    [[ $CG_PHASE == merge || $CG_PHASE == signoff ]] || fail "CG_THRESHOLDS is for CG_PHASE=merge and signoff" \
        "(the node and fabric phases take --thresholds in CG_PYTEST_ARGS)"
    [[ $CG_THRESHOLDS =~ ^[A-Za-z0-9._/-]+$ ]] \
        || fail "CG_THRESHOLDS=${CG_THRESHOLDS@Q}: a path of letters, digits and ._-/ (in the image or under /reports)"
    CG_THRESHOLDS_ARGS="--thresholds '$CG_THRESHOLDS'"
fi

if [[ -n ${CG_LEVEL:-} ]]; then
    [[ $CG_PHASE == merge ]] || fail "CG_LEVEL is for CG_PHASE=merge (the node and fabric phases take --level in" \
        "CG_PYTEST_ARGS)"
    [[ $CG_LEVEL =~ ^(quick|standard|extended)$ ]] || fail "CG_LEVEL=${CG_LEVEL@Q}: quick, standard or extended"
    CG_LEVEL_ARGS="--level $CG_LEVEL"
fi
if [[ -n $CG_STORE ]]; then
    # The one volume every pod of every phase mounts: a store elsewhere would be each pod's own.
    [[ $CG_STORE =~ ^/reports/[A-Za-z0-9._/-]+$ && $CG_STORE != */ && $CG_STORE != *..* ]] \
        || fail "CG_STORE=${CG_STORE@Q}: a file on the reports volume, e.g. /reports/clustergate.db"
    CG_STORE_ARGS="--store '$CG_STORE'"
fi

manifest=${1:-$default_manifest}
[[ -f $manifest ]] || manifest=$here/$manifest
[[ -f $manifest ]] || fail "no manifest $1"

export CG_NAME=${CG_NAME:-clustergate}
export CG_NODES=${CG_NODES:-2}
export CG_GPUS_PER_NODE=${CG_GPUS_PER_NODE:-8}
export CG_REGISTRY=${CG_REGISTRY:-}
export CG_IMAGE=${CG_IMAGE:-}
if [[ -z $CG_IMAGE && -n $CG_REGISTRY ]]; then
    CG_IMAGE=$(clustergate_image "$CG_REGISTRY" CG_REGISTRY 2>&1) || fail "$CG_IMAGE"
fi
export CG_WORKDIR=${CG_WORKDIR:-/opt/clustergate}
export CG_PYTEST_ARGS=${CG_PYTEST_ARGS:-acceptance}
export CG_RDMA_RESOURCE=${CG_RDMA_RESOURCE:-}
export CG_RDMA_COUNT=${CG_RDMA_COUNT:-1}
export CG_RDZV_PORT=${CG_RDZV_PORT:-29500}
export CG_RDZV_TIMEOUT=${CG_RDZV_TIMEOUT:-900}
export CG_DEADLINE_S=${CG_DEADLINE_S:-10800}
export CG_PVC=${CG_PVC:-clustergate-reports}
export CG_SHARED_DIR=${CG_SHARED_DIR:-/reports}
export CG_REPORT_DIR=${CG_REPORT_DIR:-}
export CG_NCCL_CONFIGMAP=${CG_NCCL_CONFIGMAP:-clustergate-nccl}
export CG_SHM_SIZE=${CG_SHM_SIZE:-64Gi}
export CG_STORAGE_CLASS=${CG_STORAGE_CLASS:-}
export CG_PVC_SIZE=${CG_PVC_SIZE:-100Gi}
export CG_NODE_SELECTOR=${CG_NODE_SELECTOR:-}
export CG_TOLERATIONS=${CG_TOLERATIONS:-}
export CG_LABEL_NODES=${CG_LABEL_NODES:-}
export CG_NAMESPACE=${CG_NAMESPACE:-}

if [[ $(basename "$manifest") != reports-pvc.yaml && -z $CG_IMAGE ]]; then
    fail "set CG_REGISTRY to the registry the clustergate image was pushed to (the image is then" \
        "CG_REGISTRY/clustergate:$(clustergate_version); README, \"Container image\"), or CG_IMAGE to another image"
fi
for n in CG_NODES CG_GPUS_PER_NODE CG_RDMA_COUNT CG_RDZV_PORT CG_RDZV_TIMEOUT CG_DEADLINE_S; do
    [[ ${!n} =~ ^[0-9]{1,9}$ ]] || fail "$n=${!n@Q} is not a whole number"
done
((CG_NODES >= 1)) || fail "CG_NODES=$CG_NODES: at least 1"
((CG_RDZV_PORT >= 1 && CG_RDZV_PORT <= 65535)) || fail "CG_RDZV_PORT=$CG_RDZV_PORT is not a port (1-65535)"
check CG_NAME "$dns_label" "a DNS label of at most 52 characters (a-z, 0-9, '-', starting with a letter)"
[[ -z $CG_IMAGE ]] || check CG_IMAGE "$image_ref" "an image reference (registry/name:tag or @sha256:..., no spaces)"
check CG_WORKDIR "$abs_path" "an absolute path of letters, digits and ._-/"
check CG_SHARED_DIR "$abs_path" "an absolute path of letters, digits and ._-/"
[[ -z $CG_REPORT_DIR ]] || check CG_REPORT_DIR "$abs_path" "an absolute path of letters, digits and ._-/"
check CG_PVC "$dns_subdomain" "a Kubernetes object name (a-z, 0-9, '-', '.')"
check CG_NCCL_CONFIGMAP "$dns_subdomain" "a Kubernetes object name (a-z, 0-9, '-', '.')"
[[ -z $CG_STORAGE_CLASS ]] || check CG_STORAGE_CLASS "$dns_subdomain" "a storage class name (a-z, 0-9, '-', '.')"
[[ -z $CG_NAMESPACE ]] || check CG_NAMESPACE '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$' "a namespace name"
check CG_SHM_SIZE "$quantity" "a size such as 64Gi"
check CG_PVC_SIZE "$quantity" "a size such as 100Gi"
[[ -z $CG_RDMA_RESOURCE ]] || check CG_RDMA_RESOURCE "^[a-z0-9]([a-z0-9.-]*[a-z0-9])?/[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$" \
    "an extended resource name such as rdma/ib"
# pytest's arguments reach `bash -c` in the pod: plain words only, no quotes, spaces inside a word or shell syntax.
read -r -a words <<< "$CG_PYTEST_ARGS"
[[ $CG_PYTEST_ARGS != *$'\n'* ]] || fail "CG_PYTEST_ARGS=${CG_PYTEST_ARGS@Q} holds a line break: plain words only"
for w in "${words[@]}"; do
    [[ $w =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]] || fail "CG_PYTEST_ARGS: the word ${w@Q} is not plain:" \
        "words of letters, digits and _./:=,+@%- only (a -k expression: one word, e.g. -k test_world)"
done
export CG_PYTEST_ARGS="${words[*]}"

# nodeSelector and tolerations, as JSON (a YAML flow value) built from the checked parts only.
export CG_NODE_SELECTOR_JSON=""
if [[ -n $CG_NODE_SELECTOR ]]; then
    items=()
    IFS=, read -r -a pairs <<< "$CG_NODE_SELECTOR"
    for pair in "${pairs[@]}"; do
        [[ $pair =~ ^($label_key)=($label_value)$ ]] || fail "CG_NODE_SELECTOR: ${pair@Q} is not" \
            "KEY=VALUE with a label key and value (e.g. nvidia.com/gpu.present=true)"
        items+=("\"${pair%%=*}\": \"${pair#*=}\"")
    done
    CG_NODE_SELECTOR_JSON="{$(printf '%s, ' "${items[@]}" | sed 's/, $//')}"
fi
tolerations=()
if [[ -n $CG_TOLERATIONS ]]; then
    IFS=, read -r -a specs <<< "$CG_TOLERATIONS"
    for spec in "${specs[@]}"; do
        [[ $spec =~ ^($label_key)(=($label_value))?(:(NoSchedule|PreferNoSchedule|NoExecute))?$ ]] \
            || fail "CG_TOLERATIONS: ${spec@Q} is not KEY[=VALUE][:EFFECT] (EFFECT NoSchedule," \
                "PreferNoSchedule or NoExecute), e.g. nvidia.com/gpu:NoSchedule"
        key=${spec%%[=:]*} rest=${spec#"$key"} value="" effect=""
        [[ $rest == :* ]] && effect=${rest#:}
        if [[ $rest == =* ]]; then
            value=${rest#=}
            value=${value%%:*}
            [[ $rest == *:* ]] && effect=${rest##*:}
        fi
        t="{\"key\": \"$key\", \"operator\": \"$([[ $rest == =* ]] && echo Equal || echo Exists)\""
        [[ $rest == =* ]] && t+=", \"value\": \"$value\""
        [[ -n $effect ]] && t+=", \"effect\": \"$effect\""
        tolerations+=("$t}")
    done
fi
if [[ $(basename "$manifest") == node-phase.yaml ]]; then
    # A node clustergate excluded before (CG_LABEL_NODES) is tested again in the next run's node phase.
    tolerations+=('{"key": "clustergate.io/excluded", "operator": "Exists", "effect": "NoSchedule"}')
fi
export CG_TOLERATIONS_JSON=""
if ((${#tolerations[@]} > 0)); then
    CG_TOLERATIONS_JSON="[$(printf '%s, ' "${tolerations[@]}" | sed 's/, $//')]"
fi

case $CG_LABEL_NODES in
    "" | 0) CG_LABEL_NODES="" ;;
    1)
        [[ $CG_PHASE == merge ]] || fail "CG_LABEL_NODES=1 is for CG_PHASE=merge (the nodes are labelled from its host lists)"
        [[ -n $CG_NAMESPACE ]] || fail "CG_LABEL_NODES=1 needs CG_NAMESPACE: the namespace the Jobs run in (the" \
            "ClusterRoleBinding names the labeller's ServiceAccount there)"
        ;;
    *) fail "CG_LABEL_NODES=${CG_LABEL_NODES@Q}: 1 to label and taint the nodes after the merge, else 0" ;;
esac
export CG_REPORT_DIR=${CG_REPORT_DIR:-/reports/$CG_NAME-\$(CLUSTERGATE_RDZV_ID)}  # $(...): Kubernetes fills it in

# Only the CG_ variables are substituted: $(VAR) references for Kubernetes stay as they are.
vars=$(compgen -v CG_ | sed 's/.*/${&}/' | tr '\n' ' ')
render() {
    local line
    while IFS= read -r line; do
        if [[ $line =~ \#\ only\ if\ (CG_[A-Z_]+)$ && -z ${!BASH_REMATCH[1]} ]]; then
            continue
        fi
        printf '%s\n' "$line"
    done < "$1" | envsubst "$vars"
}
render "$manifest"
if [[ -n $CG_LABEL_NODES ]]; then
    render "$here/label-nodes-rbac.yaml"
fi
