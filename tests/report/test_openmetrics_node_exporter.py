"""The metrics.prom files clustergate writes, read together by a real node_exporter textfile collector.

A node run's ``metrics.prom`` (the shared real run), a merge's ``metrics.prom`` and a sign-off's
``signoff-metrics.prom`` (both by the real commands) in one directory, as the README suggests; Debian's
``prometheus-node-exporter`` is started on a free localhost port with only its textfile collector, and every
family and series of the three files must come back from ``/metrics``, with the HELP the files give, and nothing
logged as an error (node_exporter drops a family whose HELP differs between files, and logs it at every scrape).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from fleet_data import merged_docs
from prometheus_client.parser import text_string_to_metric_families
from trust_runs import node_run  # noqa: F401  (the fixture)

EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
pytestmark = pytest.mark.skipif(EXPORTER is None, reason="node_exporter is not installed (Debian: apt-get install "
                                "prometheus-node-exporter; .ci/run installs it)")

START_S = 20.0
"""Hang guard for node_exporter to answer on its port: it starts in well under a second."""

Series = dict[str, tuple[str, set[tuple[frozenset[tuple[str, str]], float]]]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return str(answer.read().decode())
    except OSError:
        return None


@contextmanager
def exporter(textfiles: Path, log: Path) -> Iterator[str]:
    """node_exporter with its textfile collector alone, reading ``textfiles``; yields its /metrics URL. Another
    process may take the free port before it binds it: then it exits at once and another port is tried."""
    for _ in range(3):
        url = f"http://127.0.0.1:{_free_port()}/metrics"
        with log.open("w") as out:
            proc = subprocess.Popen([str(EXPORTER), "--collector.disable-defaults", "--collector.textfile",
                                     f"--collector.textfile.directory={textfiles}",
                                     f"--web.listen-address={url.split('/')[2]}"], stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_S
            while proc.poll() is None and time.monotonic() < deadline and _get(url) is None:
                time.sleep(0.1)
            if proc.poll() is None:
                assert _get(url) is not None, f"node_exporter did not answer on {url} in {START_S} s: {log.read_text()}"
                yield url
                return
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    pytest.fail(f"node_exporter did not start: {log.read_text()}")


def series(text: str) -> Series:
    """family -> (HELP, {(labels, value)}) of clustergate's families. An empty label is no label to Prometheus."""
    return {f.name: (f.documentation, {(frozenset((k, v) for k, v in s.labels.items() if v), s.value)
                                       for s in f.samples})
            for f in text_string_to_metric_families(text) if f.name.startswith("clustergate_")}


def test_node_exporter_keeps_every_family_and_series_of_a_run_a_merge_and_a_signoff(
        node_run: Path, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:  # noqa: F811
    _, _, merged = merged_docs(tmp_path_factory)
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    written = {"node-run.prom": node_run / "metrics.prom", "merge.prom": merged / "run" / "metrics.prom",
               "signoff.prom": merged / "solo" / "run" / "signoff-metrics.prom"}
    expected: Series = {}
    for name, source in written.items():
        text = source.read_text()
        (textfiles / name).write_text(text)
        for fam, (help_text, samples) in series(text).items():
            assert expected.get(fam, (help_text, set()))[0] == help_text, f"{fam}: two HELP texts"
            expected[fam] = (help_text, expected.get(fam, (help_text, set()))[1] | samples)
    assert {"clustergate_metric_value", "clustergate_fleet_metric", "clustergate_node_accepted"} <= set(expected)
    kinds = {dict(labels)["kind"] for labels, _ in expected["clustergate_verdict"][1]}
    assert kinds == {"run", "cluster", "signoff"}

    log = tmp_path / "node_exporter.log"
    with exporter(textfiles, log) as url:
        scraped_text = _get(url)
    assert scraped_text is not None
    scraped = series(scraped_text)
    for fam, (help_text, samples) in expected.items():
        assert fam in scraped, f"node_exporter dropped {fam}: {log.read_text()[-3000:]}"
        assert scraped[fam][0] == help_text
        got = scraped[fam][1]
        assert got == samples, f"{fam}: missing {samples - got}, more {got - samples}"
    assert set(scraped) == set(expected)
    assert "node_textfile_scrape_error 0" in scraped_text
    errors = [line for line in log.read_text().splitlines() if "level=error" in line]
    assert not errors, "\n".join(errors)
