"""Keep secrets out of the report: tokens, keys and passwords in environment variables never appear.

Two layers: values under secret-looking names are replaced wherever the report shows a mapping
(the environment table, pytest-metadata), and the values of secret-named environment variables
are scrubbed from every text the report embeds (test logs, messages, details), in case a workload
printed one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "[redacted]"

SECRET_NAME = re.compile(
    r"token(?!izer)|secret|passw|passphrase|(?<!^)(?<!OLD)pwd|credential|api_?key|access_?key|private_?key|auth(?!ors?(?:$|[_.-]))|cookie|"
    r"signature|session_?id|(^|[_.-])key($|[_.-])|(^|[_.-])pat($|[_.-])",
    re.IGNORECASE,
)
"""Names whose values are secrets: HF_TOKEN, AWS_SECRET_ACCESS_KEY, WANDB_API_KEY, DB_PASSWORD..."""

URL_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s:]+:[^/@\s]+@", re.IGNORECASE)
"""``https://user:password@host``: the userinfo of a URL is a credential."""

MIN_SCRUB_LENGTH = 6
"""Shorter secret values are not scrubbed from free text (they would mangle ordinary words)."""

PLAIN_VALUES = {"true", "false", "yes", "no", "on", "off", "none", "null"}
"""Values of secret-named variables that are settings, not secrets (never scrubbed from text)."""

SHOWN_ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "TORCHELASTIC_", "PYTORCH_", "SLURM_JOB_", "SLURM_NNODES",
                      "OMP_NUM_THREADS", "UCX_", "FI_", "NVIDIA_", "HF_", "MASTER_ADDR", "MASTER_PORT",
                      "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GLOO_")
"""Environment variables that change what a figure means, shown (redacted) in the report."""


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def redact_text(text: str) -> str:
    return URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)


def redact_mapping(data: Mapping[str, Any]) -> dict[str, Any]:
    """A copy with secret-named values replaced, nested mappings included, URL credentials removed."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if is_secret_name(str(key)):
            out[key] = REDACTED
        elif isinstance(value, Mapping):
            out[key] = redact_mapping(value)
        elif isinstance(value, str):
            out[key] = redact_text(value)
        else:
            out[key] = value
    return out


def shown_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment variables worth showing (``SHOWN_ENV_PREFIXES``), secrets redacted."""
    environ = os.environ if environ is None else environ
    chosen = {k: v for k, v in sorted(environ.items()) if k.startswith(SHOWN_ENV_PREFIXES)}
    return redact_mapping(chosen)


class Scrubber:
    """Removes known secret values from free text."""

    def __init__(self, secrets: list[str]) -> None:
        # Longest first, so a secret containing another is removed whole.
        self.secrets = sorted({s for s in secrets if len(s) >= MIN_SCRUB_LENGTH and not s.isdigit()
                               and s.lower() not in PLAIN_VALUES}, key=len, reverse=True)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None,
                         extra: Mapping[str, Any] | None = None) -> Scrubber:
        """Secrets = values of secret-named environment variables (and of ``extra``, e.g. metadata)."""
        environ = os.environ if environ is None else environ
        found = [v for k, v in environ.items() if is_secret_name(k)]
        found += _secret_values(extra or {})
        return cls(found)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return redact_text(text)


def _secret_values(data: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in data.items():
        if isinstance(value, Mapping):
            out += _secret_values(value)
        elif is_secret_name(str(key)) and isinstance(value, str):
            out.append(value)
    return out
