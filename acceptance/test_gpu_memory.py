"""GPU memory pattern test at --level extended: every word of at least 90% of free GPU memory written
and read back (walking ones, random, address in address), every GPU of a node at once.

A GPU with a word read back wrong fails, naming its host, index and serial and the first bad addresses
with what was written and what was read. Under the cpu profile the same code tests a small host buffer.
"""

from __future__ import annotations

import pytest

from acceptance.evidence import Part, gpu_label, settle_parts
from acceptance.gpu_helpers import require_device
from clustergate.run.recorder import Recorder
from workloads.gpu import memtest
from workloads.result import Result


@pytest.mark.metrics("memtest_errors", "memtest_coverage")
def test_gpu_memory_patterns(cg: Recorder) -> None:
    """Walking ones, random words and address in address over >= 90% of free GPU memory: no word may differ."""
    if cg.level != "extended":
        cg.skip(f"the memory test runs at --level extended only (this run: {cg.level})", fact="below_level",
                level=cg.level)
    require_device(cg)
    try:
        result, error = memtest.run(memtest.Config.for_level(cg.level, cg.device), cg.device), None
    except Exception as exc:  # joins the gather below, then fails this rank
        result, error = None, f"{type(exc).__name__}: {exc}"
    mine = {"error": error} if result is None else {
        "errors": result.metric("memtest_errors").value, "coverage": result.metric("memtest_coverage").value,
        **{k: v for k, v in result.details.items() if k != "bad_words"}}
    everyone = cg.all_ranks(mine)
    if error is not None:
        pytest.fail(f"memory test could not run: {error}", pytrace=False)
    parts = []
    for rank, seen in enumerate(everyone):
        if "error" in seen:
            continue  # that rank fails on its own error
        label = gpu_label(cg, rank)
        parts.append(Part("memtest_errors", rank, "gpu", label, seen["errors"], "count", "memtest",
                          tuple(f"{len(seen['first_bad'])} first bad words: " + "; ".join(seen["first_bad"])
                                for _ in [0] if seen["errors"])))
        parts.append(Part("memtest_coverage", rank, "gpu", label, seen["coverage"], "fraction", "memtest"))
    cg.record_result(Result(metrics=(), details={"per_rank": everyone}))
    settle_parts(cg, "GPU memory test", parts, {})
