"""The node's storage tiers as sites accept them: fio on the local scratch and on the shared directory (sequential
read and write GiB/s, 4 KiB random-read IOPS, a crc32c-verified read-back), and the count of local NVMe devices.

One rank per node runs fio (workloads/node/storage.py); every figure is the node's, its record naming the host,
the tier, the path and the device under it.
"""

from __future__ import annotations

import pytest

from acceptance.shared_dir import one_shared_dir
from clustergate.run.recorder import Recorder
from workloads.node import storage
from workloads.result import Metric, Result


def _not_at_quick(cg: Recorder) -> None:
    # On a lent H200 fio took 16 s a tier at quick and 52-54 s at standard with 4 GiB a job: more than quick's
    # whole budget. A tier's figure needs seconds of I/O past the drive's cache, which the seconds-long node check
    # (quick, run as a health check) has no room for.
    if cg.level == "quick":
        cg.skip("--level quick (the node check of seconds) leaves out fio: a tier's honest figure takes seconds of "
                "I/O; run --level standard for it", fact="below_level", level=cg.level)


def _fio_or_skip(cg: Recorder) -> None:
    cg.skip_unless_everywhere(storage.fio_program() is not None, storage.MISSING, fact="package_missing",
                              package="fio")


@pytest.mark.metrics("storage_local_write_gibps", "storage_local_read_gibps", "storage_local_randread_iops")
def test_local_scratch_fio(cg: Recorder) -> None:
    """fio on the node's local scratch (settings.local_scratch_dir, else $TMPDIR, else /tmp)."""
    _not_at_quick(cg)
    _fio_or_skip(cg)
    directory, chosen_by = storage.local_scratch(cg.setting("local_scratch_dir", None))
    result = storage.run(storage.Config.for_level(cg.level, cg.device, "local", directory))
    cg.record_result(Result(metrics=result.metrics, details={**result.details, "chosen_by": chosen_by}))


@pytest.mark.metrics("storage_shared_write_gibps", "storage_shared_read_gibps", "storage_shared_randread_iops")
def test_shared_dir_fio(cg: Recorder, shared_dir: str | None) -> None:
    """fio on the shared directory (the report path the launchers name), every node at once."""
    _not_at_quick(cg)
    directory = one_shared_dir(cg, shared_dir)
    _fio_or_skip(cg)
    cg.record_result(storage.run(storage.Config.for_level(cg.level, cg.device, "shared", directory)))


@pytest.mark.metrics("nvme_device_count")
def test_nvme_count(cg: Recorder) -> None:
    """The node's local NVMe devices (namespaces in /sys/block), judged where the profile gives a count."""
    me = cg.identities[cg.rank]
    mine = storage.nvme_devices() if me["local_rank"] == 0 else None
    nodes = {i["node_rank"]: (i["host"], found) for i, found in zip(cg.identities, cg.all_ranks(mine), strict=True)
             if found is not None}
    _, found = nodes[me["node_rank"]]
    cg.record_result(Result(
        metrics=(Metric("nvme_device_count", len(found["namespaces"]), "devices", "node",
                        "NVMe namespaces in /sys/block (azurehpc-health-checks' check_nvme_count)"),),
        details={"nvme": [{"node": n, "host": host, **f} for n, (host, f) in sorted(nodes.items())]}))
