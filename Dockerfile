# The clustergate container image: the suite installed from its own wheel over a CUDA build of PyTorch, with
# DeepSpeed and every dependency at the versions constraints.txt allows, for the Kubernetes manifests
# (launch/k8s) and Slurm's pyxis (launch/slurm). Its name is REGISTRY/clustergate:VERSION (launch/image.sh):
#
#   docker build -t "$(launch/image.sh ghcr.io/OWNER)" . && docker push "$(launch/image.sh ghcr.io/OWNER)"
#
# The base is PyTorch's own CUDA runtime image of the torch, CUDA and NCCL the GPU figures were measured with
# (torch 2.11, CUDA 13, NCCL 2.28: docs/reference-figures.md), pinned by name and tag: its NCCL is the one a
# run tests, and the report names it. CUDA 13 needs NVIDIA driver 580 or newer on the nodes; where the driver is
# older, build on the same torch's CUDA 12.8 image (driver 525 or newer):
#   --build-arg BASE=pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime
ARG BASE=pytorch/pytorch:2.11.0-cuda13.0-cudnn9-runtime

FROM ${BASE} AS wheels
WORKDIR /src
COPY . .
# clustergate's wheel, and DeepSpeed's at the version constraints.txt allows. DeepSpeed builds in pip's isolated
# environment, without torch: no DeepSpeed op is compiled ahead, and the suite's ZeRO-3 needs none (it runs
# torch's own AdamW, workloads/finetune/zero3.py).
RUN python3 -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels --constraint constraints.txt . deepspeed

FROM ${BASE}
LABEL org.opencontainers.image.title="clustergate" \
      org.opencontainers.image.description="GPU cluster acceptance suite: pytest under torchrun on every rank"
# numactl: torchrun --numa-binding binds each rank to its GPU's NUMA node (launch/node.sh); fio: the storage
# tiers' tests (acceptance/test_storage.py) skip without it. Their versions are the base image's Ubuntu release's:
# a pinned Debian version would stop the build at that release's next update.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends numactl fio \
    && rm -rf /var/lib/apt/lists/*
COPY --from=wheels /wheels /tmp/wheels
COPY constraints.txt /tmp/constraints.txt
# The base image's torch satisfies constraints.txt and stays. Then every module's bytecode, torch's too, written
# here as root: the image's user cannot write beside the sources, and without it every rank of every run would
# compile each module it imports again (seconds of torch alone). compileall exits 1 where a package ships a file
# that is not Python 3 (an example, a template): it names each one here, and no run can import those anyway.
RUN python3 -m pip install --no-cache-dir --constraint /tmp/constraints.txt /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels /tmp/constraints.txt \
    && { python3 -m compileall -q -j 0 "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
         || true; }
# The launchers' scripts: the manifests and node.sh run from here (CG_WORKDIR); the suite itself is the installed one.
WORKDIR /opt/clustergate
COPY launch/ launch/
# A user of its own, by number: Kubernetes' runAsNonRoot can check only a numeric user. The Kubernetes GPU pods
# run as root instead (launch/k8s: IPC_LOCK takes effect for root only), and so do the pods that write the
# reports volume they share; everything else runs as this user.
RUN groupadd --gid 10001 clustergate \
    && useradd --create-home --no-log-init --uid 10001 --gid 10001 clustergate
USER 10001:10001
CMD ["clustergate", "--help"]
