#!/usr/bin/env bash
# Fill in the ${CG_...} placeholders of a clustergate manifest and print it, ready for kubectl:
#
#   CG_NODES=2 CG_GPUS_PER_NODE=8 CG_IMAGE=registry.example/clustergate:1 \
#       launch/k8s/render.sh [clustergate.yaml|reports-pvc.yaml] | kubectl apply -f -
#
# Parameters (environment; defaults in brackets):
#   CG_NAME            Job and Service name, also the pods' DNS subdomain [clustergate]
#   CG_NODES           pods = nodes [2]
#   CG_GPUS_PER_NODE   nvidia.com/gpu per pod, and torchrun ranks per pod [8]
#   CG_IMAGE           image with the clustergate checkout and its dependencies (required)
#   CG_WORKDIR         the checkout's path inside the image [/opt/clustergate]
#   CG_PYTEST_ARGS     pytest arguments, plain words only [acceptance]
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
# A line ending in "# only if CG_X" is left out when CG_X is empty.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
manifest=${1:-clustergate.yaml}
[[ -f $manifest ]] || manifest=$here/$manifest
[[ -f $manifest ]] || { echo "render.sh: no manifest $1" >&2; exit 2; }

export CG_NAME=${CG_NAME:-clustergate}
export CG_NODES=${CG_NODES:-2}
export CG_GPUS_PER_NODE=${CG_GPUS_PER_NODE:-8}
export CG_IMAGE=${CG_IMAGE:-}
export CG_WORKDIR=${CG_WORKDIR:-/opt/clustergate}
export CG_PYTEST_ARGS=${CG_PYTEST_ARGS:-acceptance}
export CG_RDMA_RESOURCE=${CG_RDMA_RESOURCE:-}
export CG_RDMA_COUNT=${CG_RDMA_COUNT:-1}
export CG_RDZV_PORT=${CG_RDZV_PORT:-29500}
export CG_RDZV_TIMEOUT=${CG_RDZV_TIMEOUT:-900}
export CG_DEADLINE_S=${CG_DEADLINE_S:-10800}
export CG_PVC=${CG_PVC:-clustergate-reports}
export CG_SHARED_DIR=${CG_SHARED_DIR:-/reports}
export CG_NCCL_CONFIGMAP=${CG_NCCL_CONFIGMAP:-clustergate-nccl}
export CG_SHM_SIZE=${CG_SHM_SIZE:-64Gi}
export CG_STORAGE_CLASS=${CG_STORAGE_CLASS:-}
export CG_PVC_SIZE=${CG_PVC_SIZE:-100Gi}

if [[ $(basename "$manifest") == clustergate.yaml && -z $CG_IMAGE ]]; then
    echo "render.sh: set CG_IMAGE to an image holding the clustergate checkout at CG_WORKDIR" >&2
    exit 2
fi
for n in CG_NODES CG_GPUS_PER_NODE CG_RDMA_COUNT CG_RDZV_PORT CG_RDZV_TIMEOUT CG_DEADLINE_S; do
    [[ ${!n} =~ ^[0-9]+$ ]] || { echo "render.sh: $n=${!n} is not a whole number" >&2; exit 2; }
done

# Only the CG_ variables are substituted: $(VAR) references for Kubernetes stay as they are.
vars=$(compgen -v CG_ | sed 's/.*/${&}/' | tr '\n' ' ')
while IFS= read -r line; do
    if [[ $line =~ \#\ only\ if\ (CG_[A-Z_]+)$ && -z ${!BASH_REMATCH[1]} ]]; then
        continue
    fi
    printf '%s\n' "$line"
done < "$manifest" | envsubst "$vars"
