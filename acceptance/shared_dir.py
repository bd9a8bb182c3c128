"""The one directory every node mounts, as the node-phase tests that write into it take it: the same on every rank,
or the test skips (none named) or fails (ranks name different ones)."""

from __future__ import annotations

import pytest

from clustergate.run.recorder import Recorder


def one_shared_dir(cg: Recorder, shared_dir: str | None) -> str:
    """``shared_dir`` as every rank names it (the ``shared_dir`` fixture's value); skips on ``no_shared_dir`` where
    no rank names one, fails naming each node that names another than rank 0's."""
    everyone = cg.all_ranks(shared_dir)
    if all(d is None for d in everyone):
        cg.skip("no shared directory named: pass --shared-dir, set CLUSTERGATE_SHARED_DIR (the launchers in "
                "launch/ set it to the report directory) or settings.shared_dir in the profile", fact="no_shared_dir")
    differing = sorted({(str(d), f"node {cg.identities[r]['node_rank']} ({cg.identities[r]['host']})")
                        for r, d in enumerate(everyone) if d != everyone[0]})
    if differing:
        pytest.fail(f"ranks name different shared directories (rank 0: {everyone[0]!r}): "
                    + "; ".join(f"{who}: {d!r}" for d, who in differing) + "; name the same directory everywhere",
                    pytrace=False)
    return str(everyone[0])
