"""The fleet compiles once (workloads.compiled): a second node loads what the first compiled; an artifact that is
stale, foreign, damaged or writable by others is refused, never loaded, and the node compiles itself."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workloads import compiled
from workloads.training import gpt

CPU = torch.device("cpu")
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64

# One "node": its own empty compile caches, the shared directory, a suite digest. It compiles a small function with
# inductor (C++ on CPU), saving the kernels where it compiled them, and prints what its record would say.
NODE = r"""
import json, sys, torch
from workloads import compiled
directory, digest = sys.argv[1], sys.argv[2]
got = compiled.load(directory, compiled.key(torch.device("cpu"), digest, "test-gelu"))
f = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2 + 1)
with torch.no_grad():
    out = f(torch.linspace(-2, 2, 64))
assert torch.allclose(out, torch.nn.functional.gelu(torch.linspace(-2, 2, 64)) * 2 + 1)
print(json.dumps(compiled.finish(got, writer=True).as_details()))
"""


def node(tmp: Path, name: str, shared: Path, digest: str) -> dict:
    caches = tmp / f"caches-{name}"  # empty: a node's first run
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
           "TRITON_CACHE_DIR": str(caches / "triton"), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", NODE, str(shared), digest], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_second_node_loads_what_the_first_compiled_and_a_stale_artifact_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    first = node(tmp_path, "1", shared, DIGEST_A)
    assert (first["source"], first["saved"], first["refused"]) == ("compiled", True, False), first
    assert first["cache_misses"] > 0 and "no artifact for this key yet" in first["note"]
    blob = Path(first["artifact"])
    sidecar = json.loads(blob.with_suffix(".json").read_text())
    assert sidecar["sha256"] == hashlib.sha256(blob.read_bytes()).hexdigest()
    assert sidecar["compiled_for"] == first["compiled_for"]

    second = node(tmp_path, "2", shared, DIGEST_A)  # empty caches of its own: only the shared artifact can serve
    assert (second["source"], second["artifact"], second["saved"]) == ("loaded", str(blob), False), second
    assert second["cache_hits"] > 0 and second["cache_misses"] == 0, second

    # The suite changed (another digest): the old artifact is stale. Under its own name it is never opened; put where
    # the new key's would be (copied, renamed), its sidecar's key gives it away and it is refused, not loaded.
    k_b = compiled.key(CPU, DIGEST_B, "test-gelu")
    stale = compiled.path_for(shared, k_b)
    assert stale != blob
    assert compiled.load(shared, k_b).note == "no artifact for this key yet: compiled here"
    stale.write_bytes(blob.read_bytes())
    stale.with_suffix(".json").write_text(blob.with_suffix(".json").read_text())
    third = compiled.load(shared, k_b)
    assert (third.source, third.refused) == ("compiled", True), third
    assert "is for another key: suite_digest" in third.note and third.note.endswith("compiled here")


def _plant(shared: Path, data: bytes, key: dict[str, str], sha: str | None = None) -> Path:
    blob = compiled.path_for(shared, key)
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    sidecar = {"compiled_for": key, "sha256": sha or hashlib.sha256(data).hexdigest()}
    blob.with_suffix(".json").write_text(json.dumps(sidecar))
    return blob


def test_damaged_foreign_or_open_artifacts_are_refused_unloaded(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[bytes] = []
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda b: loaded.append(b) or "info")  # records it
    k = compiled.key(CPU, DIGEST_A, "t")
    blob = _plant(tmp_path, b"kernels", k, sha="0" * 64)
    got = compiled.load(tmp_path, k)
    assert (got.source, got.refused) == ("compiled", True) and "sha256 is not its sidecar's" in got.note

    other_gpu = {**k, "gpu": "NVIDIA H100 80GB HBM3 (sm 9.0)"}  # made on another GPU model, put under this key's name
    sha = hashlib.sha256(b"kernels").hexdigest()
    blob.with_suffix(".json").write_text(json.dumps({"compiled_for": other_gpu, "sha256": sha}))
    got = compiled.load(tmp_path, k)
    assert got.refused and "another key: gpu 'NVIDIA H100 80GB HBM3 (sm 9.0)'" in got.note

    _plant(tmp_path, b"kernels", k)
    blob.chmod(0o666)
    got = compiled.load(tmp_path, k)
    assert got.refused and "writable by others" in got.note
    blob.chmod(0o644)
    assert not loaded
    assert compiled.load(tmp_path, k).source == "loaded" and loaded == [b"kernels"]  # the same file, once it is sound


def test_a_link_or_bytes_torch_cannot_load_are_refused(tmp_path: Path) -> None:
    k = compiled.key(CPU, DIGEST_A, "t")
    blob = _plant(tmp_path, b"not torch's artifacts", k)
    got = compiled.load(tmp_path, k)  # the sidecar checks out; torch's loader refuses the bytes: compiled here
    assert (got.source, got.refused) == ("compiled", True) and "torch could not load" in got.note
    real = tmp_path / "elsewhere.bin"
    blob.rename(real)
    blob.symlink_to(real)
    got = compiled.load(tmp_path, k)
    assert got.refused and "not a regular file" in got.note


def test_a_directory_that_cannot_be_written_is_said_not_raised(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"kernels", None))
    (tmp_path / "file").write_text("")  # a file where the directory would be: no one can make it
    got = compiled.finish(compiled.load(tmp_path / "file", compiled.key(CPU, DIGEST_A, "t")), writer=True)
    assert (got.source, got.saved) == ("compiled", False) and "could not save" in got.note
    ok = compiled.finish(compiled.load(tmp_path / "dir", compiled.key(CPU, DIGEST_A, "t")), writer=True)
    assert ok.saved and Path(ok.artifact).read_bytes() == b"kernels"
    assert compiled.finish(compiled.load(tmp_path / "other", compiled.key(CPU, DIGEST_A, "t")), writer=False).saved \
        is False and not (tmp_path / "other").exists()  # only the writer rank saves


def test_the_key_names_gpu_torch_triton_cuda_and_suite(tmp_path: Path) -> None:
    k = compiled.key(CPU, DIGEST_A, "gpt-x")
    assert set(k) == {"gpu", "torch", "triton", "cuda", "suite_digest", "what"} and k["torch"] == torch.__version__
    assert compiled.path_for(tmp_path, k) != compiled.path_for(tmp_path, {**k, "suite_digest": DIGEST_B})
    got = compiled.load(None, k)
    assert (got.source, got.artifact) == ("compiled", None) and "no shared directory" in got.note


def test_gpt_says_its_kernels_were_not_compiled_when_eager() -> None:
    cfg = gpt.Config.for_level("quick", CPU)
    assert cfg.compile == "off"
    assert gpt._kernels(cfg, compiled.Share(None, DIGEST_A)).source == "off"
