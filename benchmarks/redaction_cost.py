"""What redaction costs: each output of a report directory scrubbed as clustergate scrubs it, timed.

Rank 0 redacts results.json at every write and, between the verdict and the final barrier (a 45 s budget with
the report's writing), scrubs report.html and junit.xml as pages; the results store redacts a document as it
records it, an evidence bundle every file it packs. The figures here are those steps on real outputs.

    python benchmarks/redaction_cost.py REPORT_DIR [REPORT_DIR ...]
    python benchmarks/redaction_cost.py --synthetic-gpus 8      # an 8-GPU node's results.json and report, made here

"first" is a scrubber that has seen nothing (as at a run's first write of the record), "again" the same one on
the same record (as at its later writes); each the best of --repeats. Run it with PYTHONPATH=OTHER_CHECKOUT to
time another version of the rules on the same files.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from clustergate.secrets import redact  # noqa: E402

from torchrun_job import job_env  # noqa: E402


def best(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def fresh() -> redact.Scrubber:
    """A scrubber of this environment that remembers nothing (nor do the format searches behind it)."""
    remembered = getattr(redact, "_cached_formats", None)  # (versions before value rules have none)
    if remembered is not None:
        remembered.cache_clear()
    return redact.Scrubber.from_environment(dict(os.environ))


def measure(directory: Path, repeats: int) -> dict[str, Any]:
    rows: dict[str, Any] = {"directory": str(directory)}
    results = directory / "results.json"
    if results.is_file():
        record = json.loads(results.read_text())
        rows["results.json bytes"] = results.stat().st_size
        rows["results.json first s"] = best(lambda: redact.redact(record, fresh()), repeats)
        warm = fresh()
        redact.redact(record, warm)
        rows["results.json again s"] = best(lambda: redact.redact(record, warm), repeats)
        if hasattr(redact, "redact_by_value"):
            rows["store record s"] = best(lambda: redact.redact_by_value(record), repeats)
    for page in ("report.html", "junit.xml"):
        path = directory / page
        if path.is_file():
            text = path.read_text()
            rows[f"{page} bytes"] = len(text.encode())
            rows[f"{page} s"] = best(lambda text=text: fresh().in_markup(text), repeats)
    progress = directory / "progress.jsonl"
    if progress.is_file():
        lines = [json.loads(line) for line in progress.read_text().splitlines() if line.strip()]
        rows["progress.jsonl s"] = best(lambda: [redact.redact(line, fresh()) for line in lines[:1]] +
                                        [redact.redact(line) for line in lines], repeats)
    if hasattr(redact, "scrub_output"):
        files = {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file() and not p.name.startswith(".")}
        rows["evidence bundle s"] = best(lambda: [redact.scrub_output(n, d, fresh()) for n, d in files.items()],
                                         repeats)
    rows["end of run s"] = sum(rows.get(k, 0.0) for k in ("results.json again s", "report.html s", "junit.xml s"))
    return rows


def synthetic(gpus: int, target: Path) -> Path:
    """A node of ``gpus`` GPUs: its results.json (tests/helpers/cluster_runs.py's shape of a real one) and its report as
    ``clustergate render`` draws it."""
    from cluster_runs import node_results

    record = node_results("gpu-node-07", 7)
    if gpus != 8:
        raise SystemExit("--synthetic-gpus: tests/helpers/cluster_runs.py makes 8-GPU nodes only")
    record["run_id"] = "run-synthetic"
    directory = target / "gpu-node-07"
    directory.mkdir(parents=True)
    (directory / "results.json").write_text(json.dumps(record, indent=2))
    drawn = subprocess.run([sys.executable, "-m", "clustergate", "render", str(directory / "results.json"), "-o",
                            str(directory / "report.html")], cwd=ROOT, env=job_env(), capture_output=True, text=True,
                           timeout=300)
    if not (directory / "report.html").is_file():
        raise SystemExit(f"clustergate render drew no report:\n{(drawn.stdout + drawn.stderr)[-3000:]}")
    return directory


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    p.add_argument("directories", nargs="*", type=Path, metavar="REPORT_DIR")
    p.add_argument("--synthetic-gpus", type=int, default=0, metavar="N", help="also time a made-up node of N GPUs")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the figures there too")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directories = list(args.directories)
        if args.synthetic_gpus:
            directories.append(synthetic(args.synthetic_gpus, Path(tmp)))
        if not directories:
            p.error("name a report directory or --synthetic-gpus N")
        figures = [measure(d, args.repeats) for d in directories]
    for rows in figures:
        print(rows["directory"])
        for key, value in rows.items():
            if key != "directory":
                print(f"  {key:24} {value:.3f}" if key.endswith(" s") else f"  {key:24} {value}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
