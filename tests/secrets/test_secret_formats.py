"""Secrets found by their value (clustergate.secrets.secret_formats, through clustergate.secrets.redact): every token
format and every text that names a secret goes, in each form an output gives it, from text, pages, the results store
and evidence bundles; figures, serials, UUIDs, host names and digests stay readable.

(The run that plants them in NCCL_* values and assertion messages is tests/run/test_run_endings.py.)"""

from __future__ import annotations

import hashlib
import html
import json
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from cluster_runs import node_results
from fleet_data import HOST, real_run, write
from secret_samples import everything, in_context, leaks, tokens
from trust_runs import node_run  # noqa: F401  (node_run: the fixture)

from clustergate.record.evidence_bundle import build
from clustergate.secrets import secret_formats
from clustergate.secrets.redact import REDACTED, Scrubber, redact, redact_by_value, scrub_output
from clustergate.store import Store

from torchrun_job import ROOT, job_env

DATA = Path(__file__).parents[1] / "data"
SCRUB = Scrubber([], ())
"""No environment's secret: only what a value looks like, or the text around it, can give it away."""
PLANTED = everything("unit")


def _forms(text: str) -> dict[str, str]:
    """``text`` as outputs carry it: said in a message, as repr shows it, inside a JSON string, inside a JSON
    string inside a JSON string, and cut short by pytest beside the whole."""
    return {"message": f"login failed with {text} (retry)", "repr": repr({"said": text}),
            "JSON": json.dumps({"log": f"sent {text}"}), "JSON in JSON": json.dumps(json.dumps({"log": text})),
            "cut": f"assert '{text[:24]}...' == 'x'\nE   where the whole was {text}"}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_every_secret_goes_from_text_in_every_form(name: str) -> None:
    planted = PLANTED[name]
    for form, text in _forms(planted.text).items():
        said = SCRUB(text)
        assert not leaks(said, {name: planted}), (form, said)
        assert REDACTED in said, (form, said)


@pytest.mark.parametrize("name", sorted(tokens("unit")))
def test_every_token_format_goes_from_a_page(name: str) -> None:
    """A page (report.html, junit.xml) as written: the token as text, HTML-escaped, in a JSON attribute."""
    planted = PLANTED[name]
    blob = html.escape(json.dumps({"m": planted.text}))
    page = (f"<td>{html.escape(planted.text)}</td><div data-jsonblob=\"{blob}\"></div>"
            f"<failure message=\"{html.escape(planted.text).replace(chr(10), '&#10;')}\"/>")
    assert not leaks(SCRUB.in_markup(page), {name: planted}), SCRUB.in_markup(page)


@pytest.mark.parametrize("name", sorted(set(in_context("unit")) - {"-Dpassword=X"}))
def test_a_secret_its_text_names_goes_from_a_page_too(name: str) -> None:
    """On a page only the punctuation no page uses for itself is read: an option, a quoted name, a URL."""
    planted = PLANTED[name]
    page = f"<pre>{html.escape(planted.text)}</pre><div data-x=\"{html.escape(json.dumps({'m': planted.text}))}\">"
    assert not leaks(SCRUB.in_markup(page), {name: planted}), SCRUB.in_markup(page)


def test_a_private_key_goes_whole_whatever_its_lines_look_like() -> None:
    key = PLANTED["private key"]
    lines = key.text.splitlines()
    diff = "\n".join(f"E         + {line}" for line in lines)  # pytest's diff of a value of several lines
    cut = repr(key.text)[:90] + "..."  # pytest's repr of a long value, shortened
    for text in (diff, cut, key.text.replace("\n", "&#10;"), json.dumps(json.dumps(key.text))):
        assert not leaks(SCRUB(text), {"key": key}) and not leaks(SCRUB.in_markup(text), {"key": key}), text
    assert SCRUB(f"before {key.text} after") == f"before {REDACTED} after"


def test_a_key_in_the_environment_leaves_another_keys_block_whole() -> None:
    """Every key has the same BEGIN and END lines: known from one key, they must not cut another's block into
    lines its body then hides among."""
    known, said = tokens("environment")["private key"], PLANTED["private key"]
    scrub = Scrubber.from_environment({"TLS_KEY": known.text})
    for text in (f"workload log:\n  {said.text}\n", json.dumps(said.text), f"{known.text} and {said.text}"):
        assert not leaks(scrub(text), {"known": known, "said": said}), scrub(text)


def test_what_names_a_secret_keeps_its_name() -> None:
    """Only the secret goes: the option, the key, the URL's host stay, so a message still says what it was."""
    said = {name: SCRUB(p.text) for name, p in in_context("unit").items()}
    assert said["--password=X"] == f"--password={REDACTED}"
    assert said["--token X"] == f"--token {REDACTED}"
    assert json.loads(said['"password": "X"']) == {"password": REDACTED}
    assert said["user:password@"] == f"https://{REDACTED}@store.example/bucket"
    assert json.loads(json.loads(said["JSON in a JSON string"])["config"]) == {"secret": REDACTED}
    assert said["-Dpassword=X"] == f"java -Dpassword={REDACTED} -jar tool.jar"
    options = "--key-file /etc/clustergate/site.key --level quick"
    assert SCRUB(options) == options


READABLE = [
    "sha256:3f1a9c0b5e7d2f4a6c8e0b1d3f5a7c9e1b3d5f7a9c1e3b5d7f9a1c3e5b7d9f1a",
    "digest 9b2e4c6a8d0f1e3c5a7b9d2f4e6a8c0b1d3f5e7a9c2b4d6f8e0a1c3b5d7f9e2a4c6b8d0f",
    "GPU-5c1f0e7a-3b2d-4c11-9e2a-000000000001 serial 1652823054301 pci 00000000:2A:00.0",
    "MIG-4d2c8e1a-7b3f-5a9e-8c1d-2e4f6a8b0c1d",
    "host gpu-node-07.cluster.example (10.12.0.7), rank 5, node_rank 0",
    "matmul_bf16_tflops=761.3 TFLOPS, expected >= 700 [h100-sxm-80gb, 16 ranks, gpu-node-07 gpu 5]",
    "acceptance/test_gpu_compute.py::test_matmul_tflops[bf16] passed in 12.4 s",
    "train_tokens_per_s_per_gpu 512345.5 tokens/s; tokens: 4096; KeyError: 'password'",
    "driver 570.133.20, cuda 12.8, nccl 2.27.3, torch 2.8.0+cu128, started 2026-11-28T00:05:12+00:00",
    "NCCL_IB_HCA=mlx5_0,mlx5_3 NCCL_SOCKET_IFNAME=eth0 NCCL_DEBUG=WARN time 1795773610.123",
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAoAAAAHgCAYAAAA10dzkAAAAOXRFWHRTb2Z0d2FyZQBNYXRwbG90bGli",
    "run-trust 2026-11-28T00:05:12Z nodes/cg-a results.json report.html --level quick --key-file /etc/cg.key",
]


@pytest.mark.parametrize("text", READABLE)
def test_figures_serials_uuids_hosts_and_digests_stay_readable(text: str) -> None:
    assert SCRUB(text) == text and SCRUB.in_markup(text) == text


@pytest.mark.parametrize("record", ["fleet/node-run.json", "8-GPU node"])
def test_a_gpu_nodes_record_keeps_every_figure_serial_and_uuid(record: str) -> None:
    """A real run's record (GPU serials and UUIDs replayed from an H100 node) and an 8-GPU node's: unchanged."""
    data = json.loads((DATA / record).read_text()) if record.endswith(".json") else node_results("gpu-node-07", 7)
    assert redact(data, SCRUB) == data
    assert SCRUB.in_markup(json.dumps(data, indent=2)) == json.dumps(data, indent=2)


@pytest.mark.slow  # the shared real CPU run (tests/helpers/trust_runs.py)
def test_a_real_runs_outputs_are_left_as_they_are(node_run: Path) -> None:  # noqa: F811
    """Every output of README's command 1: no figure, host, digest or test name taken for a secret."""
    for name in ("report.html", "junit.xml", "metrics.prom", "results.json", "progress.jsonl"):
        data = (node_run / name).read_bytes()
        assert scrub_output(name, data, SCRUB) == data, name
    results = json.loads((node_run / "results.json").read_text())
    assert redact(results, SCRUB) == results


def test_the_formats_are_the_librarys_and_read_offline(tmp_path: Path) -> None:
    """detect-secrets' plugins are read in a process where no socket can be opened: nothing is fetched."""
    script = tmp_path / "offline.py"
    script.write_text(
        "import socket, sys\n"
        "def refuse(*a, **k):\n    raise OSError('no network')\n"
        "socket.socket.connect = refuse\nsocket.create_connection = refuse\n"
        "from clustergate.secrets import secret_formats\n"
        "print(secret_formats.find(sys.argv[1]), len(secret_formats.formats()))\n")
    token = tokens("offline")["Slack token"].text
    out = subprocess.run([sys.executable, str(script), f"x {token} y"], env=job_env(), cwd=ROOT, text=True,
                         capture_output=True, timeout=60)
    assert out.returncode == 0 and f"['{token}']" in out.stdout, out.stderr[-2000:]
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

    plugins = {c.__name__ for c in get_mapping_from_secret_type_to_class().values()}
    assert {name for name, _ in secret_formats.LEFT_OUT} <= plugins  # a renamed plugin would be used unseen
    assert {"AWS Access Key", "GitHub Token", "Slack Token", "JSON Web Token"} <= {
        f.name for f in secret_formats.formats()}


def _message_with_everything() -> str:
    return "planted: " + " | ".join(p.text for p in PLANTED.values())


def test_the_store_keeps_no_secret_and_records_the_same_document_once(tmp_path: Path) -> None:
    """A document written before a rule existed (or edited) holding every kind of secret: the store's file has
    none of them, and recording it again, from any environment, is the same record."""
    run = real_run()
    run["tests"][0]["message"] = _message_with_everything()
    run["tests"][0]["details"] = {"log": [p.text for p in PLANTED.values()]}
    store = Store(tmp_path / "store.db")
    first = store.record(run, path=tmp_path / "results.json")
    raw = (tmp_path / "store.db").read_bytes().decode("utf-8", "replace")
    assert not leaks(raw, PLANTED), leaks(raw, PLANTED)
    stored = store.document(first.run)
    assert stored == redact_by_value(run) and REDACTED in stored["tests"][0]["message"]
    again = store.record(json.loads(json.dumps(run)), path=tmp_path / "results.json")
    assert (again.run, again.new) == (first.run, False)
    with sqlite3.connect(tmp_path / "store.db") as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 1


def test_an_evidence_bundle_carries_no_secret(tmp_path: Path) -> None:
    """Every file of a node's directory, as old or edited as it may be, leaves the site without its secrets; the
    manifest's digests are those of what the bundle holds."""
    run = real_run()
    run["error"] = _message_with_everything()
    node = write(tmp_path / "nodes" / HOST, run).parent
    message = _message_with_everything()
    (node / "report.html").write_text(f"<html><pre>{html.escape(message)}</pre></html>\n")
    (node / "junit.xml").write_text(f'<testsuite><failure message="{html.escape(message)}"/></testsuite>\n')
    (node / "progress.jsonl").write_text(json.dumps({"event": "test_end", "message": message}) + "\n")
    (node / "nvidia-smi-q.txt").write_text(f"==============NVSMI LOG==============\nNote : {message}\n")
    bundle = build(node, tmp_path)
    with tarfile.open(bundle) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    for name, data in files.items():
        assert not leaks(data.decode(), PLANTED), (name, leaks(data.decode(), PLANTED))
    assert REDACTED in json.loads(files["results.json"])["error"] and REDACTED in files["summary.txt"].decode()
    manifest = json.loads(files["MANIFEST.json"])
    assert {f["name"]: f["sha256"] for f in manifest["files"]} == {
        n: hashlib.sha256(d).hexdigest() for n, d in files.items() if n != "MANIFEST.json"}


def test_a_file_with_nothing_secret_is_bundled_byte_for_byte() -> None:
    record = json.dumps(node_results("gpu-node-07", 7), indent=1) + "\n"
    for name, data in (("results.json", record), ("progress.jsonl", '{"a": 1}\n{"b": "x"}\n'),
                       ("report.html", "<p>ok</p>\n")):
        assert scrub_output(name, data.encode(), SCRUB) == data.encode()
    assert scrub_output("results.json", b'{"m": "x \\u00e9"}', SCRUB) == b'{"m": "x \\u00e9"}'


def test_a_token_quoted_whole_anywhere_in_a_record_goes_where_another_string_cuts_it() -> None:
    """pytest shortens a long value in one field ('eyJhbGci...') and another quotes it whole: both go."""
    jwt = PLANTED["JWT"]
    record = {"message": f"assert '{jwt.text[:60]}...' == 'x'", "details": {"token_seen": jwt.text}}
    said = redact(record, SCRUB)
    assert not leaks(json.dumps(said), {"JWT": jwt}), said
    assert said["message"] == f"assert '{REDACTED}...' == 'x'"


def test_a_secret_found_in_an_environment_value_is_known_wherever_it_shows() -> None:
    """NCCL_* values are shown in the report: a token there goes from the table and from any text, cut or not."""
    github = PLANTED["GitHub token"]
    scrub = Scrubber.from_environment({"NCCL_PLANTED": f"mode=x {github.text}", "NCCL_DEBUG": "WARN"})
    assert scrub(f"assert '{github.text[:12]}...' == 'x'") == f"assert '{REDACTED}...' == 'x'"
    table = redact({"NCCL_PLANTED": f"mode=x {github.text}", "NCCL_DEBUG": "WARN"}, scrub)
    assert table == {"NCCL_PLANTED": f"mode=x {REDACTED}", "NCCL_DEBUG": "WARN"}


def test_planted_samples_are_what_the_formats_find() -> None:
    """The samples the tests plant are real instances of their format (else a test could pass on nothing)."""
    for name, planted in tokens("unit").items():
        assert secret_formats.find(planted.text), name
