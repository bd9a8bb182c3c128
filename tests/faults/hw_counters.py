"""The error-evidence tests as the acceptance suite runs them, on a captured sysfs tree
(CLUSTERGATE_HOST_ROOT) that rank 0 changes between the snapshot and the difference, as a failing
device would: CLUSTERGATE_TEST_PLANT=aer_fatal adds a fatal AER error (a completion timeout) to the
InfiniBand adapter 0000:3b:00.0; ib_down takes mlx5_0 port 1 down once and leaves it DOWN."""

import os
from pathlib import Path

from acceptance import test_errors_after as after
from acceptance.evidence import error_baseline  # noqa: F401  (the session fixture the tests share)
from acceptance.test_errors_before import test_error_counters_before_load  # noqa: F401


def _bump(path: Path, name: str, by: int = 1) -> None:
    lines = path.read_text().splitlines()
    out = []
    for line in lines:
        key, value = line.split()
        out.append(f"{key} {int(value) + by}" if key == name else line)
    path.write_text("\n".join(out) + "\n")


def test_load_in_between(cg) -> None:
    root, plant = Path(os.environ["CLUSTERGATE_HOST_ROOT"]), os.environ.get("CLUSTERGATE_TEST_PLANT", "")
    if cg.rank == 0:
        nic = root / "sys/bus/pci/devices/0000:3b:00.0"
        port = root / "sys/class/infiniband/mlx5_0/ports/1"
        if "aer_fatal" in plant:
            for name in ("CmpltTO", "TOTAL_ERR_FATAL"):
                _bump(nic / "aer_dev_fatal", name)
        if "ib_down" in plant:
            counter = port / "counters/link_downed"
            counter.write_text(f"{int(counter.read_text()) + 1}\n")
            (port / "state").write_text("1: DOWN\n")
    cg.all_ranks(None)  # every rank reads after the change


test_pcie_aer_errors_during_run = after.test_pcie_aer_errors_during_run
test_infiniband_errors_during_run = after.test_infiniband_errors_during_run
