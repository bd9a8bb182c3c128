"""Keyed records: with a site key, every record carries an HMAC-SHA256 over its canonical content, host and run id.

A site that gives clustergate a key (``--key-file FILE``, else ``$CLUSTERGATE_KEY_FILE``: a file only the job's user
can read) has every results.json (rank 0 signs it at every write), merged record and sign-off carry an ``hmac``
section: ``{"alg": "HMAC-SHA256", "host": HOST, "run_id": RUN_ID, "value": HEX}``, the HMAC (stdlib ``hmac``) over
the record's canonical JSON without that section (keys sorted, no spaces, UTF-8), the host that wrote it and the
run id. Merge and sign-off given the key take only files whose HMAC matches; the digests the merged record keeps of
the node files are keyed too (``digest``). A record edited after it was written, re-signed with another key, or
stripped of its section is refused, naming the file; without the key nobody can make one that passes.

Without a key nothing is keyed: digests and records are plain, and whoever can write the report directories can
write a record that reads as a run (docs/contract.md, "What an accept attests", says what is and is not protected then).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clustergate.common import inputfile

KEY_ENV = "CLUSTERGATE_KEY_FILE"
FIELD = "hmac"
ALG = "HMAC-SHA256"
DIGEST_PREFIX = "hmac-sha256:"
MAX_KEY_BYTES = 4096
MIN_KEY_BYTES = 16
"""A key shorter than this is guessable; 32 random bytes (``head -c 32 /dev/urandom > key``) is the usual."""


class KeyFileError(ValueError):
    """The key file cannot be used: one line naming it and what to do (exit 2)."""


def key_path(given: str | Path | None) -> Path | None:
    """The key file: ``given`` (``--key-file``), else ``$CLUSTERGATE_KEY_FILE``; None for none (``''`` is none)."""
    chosen = given if given is not None else os.environ.get(KEY_ENV)
    return Path(chosen) if chosen else None


def load_key(path: Path) -> bytes:
    """The key in ``path``: a regular file of the running user that neither group nor others can read or write (it
    would let them sign records), read through the one reader of inputs (``clustergate.common.inputfile``: never blocks
    on a FIFO, size-capped); KeyFileError otherwise. A link is followed (a Kubernetes secret is one) and its target held
    to the same."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise KeyFileError(f"--key-file {path}: cannot open the site key ({exc.strerror or exc}); give a regular "
                           f"file only this user can read (chmod 600 {path})") from None
    if not stat.S_ISREG(info.st_mode):
        raise KeyFileError(f"--key-file {path}: not a regular file; give the file that holds the site key")
    if info.st_mode & 0o077:
        raise KeyFileError(f"--key-file {path}: group or others may read or write the site key (mode "
                           f"{stat.S_IMODE(info.st_mode):o}), so they could sign records: chmod 600 {path}")
    if info.st_uid != os.geteuid():
        raise KeyFileError(f"--key-file {path}: owned by uid {info.st_uid}, not the user who runs "
                           f"({os.geteuid()}): the key must be this user's own (chown, then chmod 600 {path})")
    try:
        key = inputfile.read_bytes(path, "hmac").strip()
    except (OSError, inputfile.InputFileError) as exc:
        raise KeyFileError(f"--key-file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if len(key) > MAX_KEY_BYTES or len(key) < MIN_KEY_BYTES:
        raise KeyFileError(f"--key-file {path}: a site key is {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes, this one is "
                           f"{len(key)}: write one with head -c 32 /dev/urandom | base64 > {path}; chmod 600 {path}")
    return key


def given_key(given: str | Path | None) -> bytes | None:
    """The site key named by ``given`` or ``$CLUSTERGATE_KEY_FILE`` (None without one); KeyFileError as ``load_key``."""
    path = key_path(given)
    return load_key(path) if path is not None else None


def canonical(record: Mapping[str, Any]) -> bytes:
    """The record as the HMAC covers it: its JSON without the ``hmac`` section, keys sorted, no spaces, UTF-8."""
    content = {k: v for k, v in record.items() if k != FIELD}
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def _mac(key: bytes, record: Mapping[str, Any], host: str, run_id: str | None) -> str:
    head = f"clustergate keyed record 1\0{host}\0{run_id or ''}\0".encode()
    return hmac.new(key, head + canonical(record), hashlib.sha256).hexdigest()


def sign(record: Mapping[str, Any], key: bytes, host: str) -> dict[str, Any]:
    """``record`` with its ``hmac`` section: the HMAC over its content (as written: sign what is read back), ``host``
    (the host that writes it) and its ``run_id``."""
    run_id = record.get("run_id")
    return {**{k: v for k, v in record.items() if k != FIELD},
            FIELD: {"alg": ALG, "host": host, "run_id": run_id, "value": _mac(key, record, host, run_id)}}


def problem(record: Mapping[str, Any], key: bytes, host: str | None = None) -> str | None:
    """Why ``record`` does not carry a valid HMAC under ``key`` (None when it does): no ``hmac`` section, another
    run id or host than its own, or an HMAC its content does not give (edited, or another key). ``host``: the host
    that must have written it, where the reader knows it (a node run's own)."""
    block = record.get(FIELD)
    if not isinstance(block, Mapping) or not isinstance(block.get("value"), str):
        return "it carries no HMAC (written without the site key, or its hmac section removed)"
    if block.get("alg") != ALG or not isinstance(block.get("host"), str):
        return f"its hmac section is not {ALG} over a host and run id"
    if block.get("run_id") != record.get("run_id"):
        return f"its HMAC is for run {block.get('run_id')!r}, the record says {record.get('run_id')!r}"
    if host is not None and block["host"] != host:
        return f"its HMAC was made on {block['host']!r}, not on {host!r}, the host it names"
    if not hmac.compare_digest(block["value"], _mac(key, record, block["host"], block.get("run_id"))):
        return "its HMAC does not match its content: edited after it was written, or signed with another key"
    return None


def writer(record: Mapping[str, Any]) -> str | None:
    """The host that must have written a run's results.json: its node_rank 0's (rank 0 signs it)."""
    nodes = [n for n in record.get("nodes") or [] if isinstance(n, Mapping)]
    first = min(nodes, key=lambda n: n.get("node_rank", 0), default=None)
    return str(first["host"]) if first is not None and first.get("host") is not None else None


def digest(key: bytes, plain: str) -> str:
    """A file's keyed digest: the HMAC of its sha256 digest (``plain``, ``sha256:HEX``), which only the key's holder
    can compute again for an edited file."""
    return DIGEST_PREFIX + hmac.new(key, f"clustergate file 1\0{plain}".encode(), hashlib.sha256).hexdigest()
