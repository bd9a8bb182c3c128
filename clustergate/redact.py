"""The one redaction: no secret reaches any output (results.json, progress.jsonl, junit.xml,
report.html, the terminal), from any rank.

A secret is
- the value of an environment variable whose name looks secret (``is_secret_name``: TOKEN, KEY, SECRET,
  PASSWORD, CREDENTIAL, AUTH, *PASS, *PW, *CREDS, *DSN, *CONNECTION_STRING, *WEBHOOK*, ... in any case)
  or is named in the site's own list ``CLUSTERGATE_REDACT_VARS`` (comma-separated names or patterns);
- the userinfo of a URL (``https://user:password@host``, ``https://TOKEN@host``, ``http://:pw@host``);
- the value of a ``Name=value`` or ``Name: value`` pair inside a text whose name looks secret
  (``AccountKey=...;``, ``password=...``, ``?sig=...&``, ``password: ...``, ``Authorization: Basic ...``)
  and the credential after ``Bearer``; such a value found inside any environment variable's value or any
  ``--metadata`` value is a known secret from then on, wherever it appears.
Structured data (JSON, mappings) loses the string values under such names; every text loses the
known secret values wherever they appear, so a message or a captured log that quotes a token is
scrubbed too, and so are the 8+ character heads and tails that pytest leaves of a long value it
shortens (``'AKIAIOSF...AMPLEKEY'``), every line of a secret of several lines (a PEM key: pytest's
assertion diff shows it line by line), and a secret as ``repr`` or JSON escapes it (a backslash, a tab).
Over-redacting a harmless variable costs nothing; a leak does.

Names the run itself chose (its report directory, its run id, the paths a command was given) are kept
whole (``keep``): a short secret that happens to be a part of them (``BMC_PASSWORD=2026``) must not move
every output to ``[redacted]/``.

Each rank knows only its own environment: every rank scrubs what it sends to the others
(``outgoing``) before it leaves the rank, and rank 0 scrubs what it writes.
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import json
import os
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from clustergate.reportdir import write_atomic

REDACTED = "[redacted]"

SITE_LIST = "CLUSTERGATE_REDACT_VARS"
"""Environment variable naming more secret variables, comma-separated (``DB_URL,MYCO_*``): a site's own names."""

SECRET_NAME = re.compile(
    r"token(?!s_per_)|key|secret|passw|passphrase|credential|creds|auth|cookie|signature|session_?id|"
    r"webhook|dsn($|[_.-])|conn(ection)?_?str(ing)?|"
    r"(?-i:(?<=[A-Z0-9_.-])PASS)$|(^|[_.-])pass[_.-]|(^|[_.-])pw($|[_.-])|(?-i:(?<=[A-Z0-9_.-])PW)$|"
    r"(?<!^)(?<!OLD)pwd|(^|[_.-])pat($|[_.-])|^sig$",
    re.IGNORECASE,
)
"""Names whose values are secrets: HF_TOKEN, AWS_SECRET_ACCESS_KEY, NCCL_IB_AUTH_TOKEN, DB_PASSWORD, DB_PWD,
DB_PASS, SMTP_PW, AZURE_CREDS, SENTRY_DSN, DB_CONNECTION_STRING, SLACK_WEBHOOK_URL, GITHUB_PAT, sig (an
Azure SAS signature)... (*PASS and *PW at the end of a name count in capitals, the way environment variables
are named: a record's ``errors_by_pass`` is a count. PWD and OLDPWD are the working directory, not passwords;
``*_tokens_per_s_*`` names a throughput figure, and data keyed by it, such as a merged fleet's per-metric tables,
keeps its text.)"""

NOT_SECRET_NAME = re.compile(r"XDG_SESSION_ID|\w*_IB_PKEY", re.IGNORECASE)
"""Names the pattern catches that hold no secret, only a small number that, scrubbed from text, would turn
every standalone "3" or "10" of a report into [redacted]: the login session, an InfiniBand partition key
index (NCCL_IB_PKEY, UCX_IB_PKEY: a setting the report shows)."""

URL_USERINFO = re.compile(
    r"(?<![a-z0-9+.-])(?P<scheme>[a-z][a-z0-9+.-]{0,31}://)"
    r"(?:[^\s@/:\"'<>]{0,256}:[^\s\"'<>]{0,512}|[^\s@/:\"'<>]{1,256})@",
    re.IGNORECASE)
"""The userinfo of a URL is a credential: ``user:password@`` (the password may hold ``@`` and ``/``: up to the
last ``@`` of the word), ``:password@``, ``TOKEN@``. A userinfo without ``:`` holds no ``/`` (else
``https://registry.example/@scope/pkg`` would lose its host). Bounded and anchored at the start of a word:
unbounded, it backtracks through every base64 figure of report.html (6.5 s for 4 MB, 0.1 s so)."""

SECRET_PAIR = re.compile(r"(?<![\w.+/=-])(?P<name>[A-Za-z_][\w.-]{0,63})=(?P<quote>['\"]|&#x27;|&#39;|&#34;|&quot;|)"
                         r"(?P<value>[^\s;&\"'<>,]+)")
"""``Name=value`` inside a text (connection strings, query strings, command lines): the value goes when the
name looks secret (``AccountKey=``, ``SharedAccessKey=``, ``Password=``, ``sig=``); quoted too, HTML-escaped too."""

COLON_PAIR = re.compile(
    r"(?<![\w.+/=-])(?P<name>[A-Za-z_][\w.-]{0,63})(?P<sep>[ \t]*:[ \t]*)(?P<quote>['\"]?)"
    r"(?P<scheme>(?:bearer|basic|digest|negotiate|token)[ \t]+)?(?P<value>[^\s;&\"'<>,]+)", re.IGNORECASE)
"""``Name: value`` inside a text (an HTTP header, a YAML or log line): the value goes when the name looks secret
(``Authorization: Bearer ...``, ``password: ...``, ``X-Api-Key: ...``); an authentication scheme stays."""
NOT_A_SECRET_KEY = re.compile(r".*(error|exception|warning|tokens|keys)", re.IGNORECASE)
"""``KeyError: 'x'``, ``tokens: 4096``: a colon after such a name starts a message or a count, not a secret."""
BEARER = re.compile(r"(?<![\w-])(?P<scheme>bearer[ \t]+)(?P<value>[A-Za-z0-9._~+/=-]{6,})", re.IGNORECASE)
"""The credential after ``Bearer``, wherever it stands."""

SHORT = 6
"""Values shorter than this, and digits-only values, are scrubbed from text only where they stand alone
(not inside a longer word or number): a 4-digit PIN must not eat every year and size in a report."""

PART = 8
"""A head or tail this long of a longer secret, cut by "..." (pytest shortens long values in assertion
text that way: ``'AKIAIOSF...AMPLEKEY'``), is scrubbed too."""

PLAIN_VALUES = {"true", "false", "yes", "no", "on", "off", "none", "null", "0", "1"}
"""Values of secret-named variables that are settings, not secrets (never scrubbed from text). A value of a
single character is a flag too (there is nothing in it to hide, and every standalone digit would go)."""

SHOWN_ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "TORCHELASTIC_", "PYTORCH_", "SLURM_JOB_", "SLURM_NNODES",
                      "OMP_NUM_THREADS", "UCX_", "FI_", "NVIDIA_", "HF_", "MASTER_ADDR", "MASTER_PORT",
                      "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GLOO_")
"""Environment variables that change what a figure means, shown (redacted) in the report."""


@lru_cache(maxsize=16)
def _site_names(listed: str) -> tuple[str, ...]:
    return tuple(n.strip().upper() for n in listed.split(",") if n.strip())


def is_secret_name(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether values under ``name`` are secrets: a secret-looking name, or one of CLUSTERGATE_REDACT_VARS."""
    return _is_secret_name(name, (os.environ if environ is None else environ).get(SITE_LIST, ""))


@lru_cache(maxsize=8192)
def _is_secret_name(name: str, site_list: str) -> bool:
    # Cached: a results record asks about the same few hundred keys hundreds of thousands of times.
    if NOT_SECRET_NAME.fullmatch(name):
        return False
    if SECRET_NAME.search(name):
        return True
    return any(fnmatch.fnmatchcase(name.upper(), pattern) for pattern in _site_names(site_list))


def _url(m: re.Match[str]) -> str:
    return f"{m.group('scheme')}{REDACTED}@"


def _pair(m: re.Match[str]) -> str:
    if not is_secret_name(m.group("name")) or m.group("value") == REDACTED:
        return m.group(0)
    return f"{m.group('name')}={m.group('quote')}{REDACTED}"


def _colon(m: re.Match[str]) -> str:
    name = m.group("name")
    if not is_secret_name(name) or NOT_A_SECRET_KEY.fullmatch(name) or m.group("value") == REDACTED:
        return m.group(0)
    return f"{name}{m.group('sep')}{m.group('quote')}{m.group('scheme') or ''}{REDACTED}"


def _bearer(m: re.Match[str]) -> str:
    return m.group(0) if m.group("value") == REDACTED else f"{m.group('scheme')}{REDACTED}"


def _pairs(text: str) -> str:
    """The values of secret-named ``Name=value`` and ``Name: value`` pairs, and ``Bearer`` credentials."""
    return BEARER.sub(_bearer, COLON_PAIR.sub(_colon, SECRET_PAIR.sub(_pair, text)))


def embedded_secrets(text: str) -> list[str]:
    """The secret values a text holds in secret-named pairs (``token=X``, ``password: X``, ``Bearer X``,
    a URL's userinfo): what a variable or a metadata value that is not itself secret may carry."""
    found = [m.group("value") for m in SECRET_PAIR.finditer(text) if is_secret_name(m.group("name"))]
    found += [m.group("value") for m in COLON_PAIR.finditer(text)
              if is_secret_name(m.group("name")) and not NOT_A_SECRET_KEY.fullmatch(m.group("name"))]
    found += [m.group("value") for m in BEARER.finditer(text)]
    for m in URL_USERINFO.finditer(text):
        userinfo = m.group(0)[len(m.group("scheme")):-1]
        found.append(userinfo.split(":", 1)[1] if ":" in userinfo else userinfo)  # a password or a token, not a user
    return [f for f in found if f and f != REDACTED]


def variants(secret: str) -> list[str]:
    """``secret`` and the forms it takes in an output: each line of a value of several lines (pytest's assertion
    diff shows a PEM key line by line), and the value as ``repr`` and JSON escape it (a backslash, a tab)."""
    forms = [secret]
    if "\n" in secret or "\r" in secret:  # a line of no letter or digit ("==") is a page's own punctuation
        forms += [line.strip() for line in secret.splitlines()
                  if len(line.strip()) >= 4 and any(c.isalnum() for c in line)]
    for escaped in (repr(secret)[1:-1], json.dumps(secret)[1:-1], secret.encode("unicode_escape").decode("ascii")):
        if escaped != secret:
            forms.append(escaped)
    return forms


_KEPT: list[str] = []
"""Names the run chose itself, never scrubbed (``keep``)."""


def keep(*names: str | None) -> None:
    """Never scrub ``names`` (the report directory's path, the run id, the paths a command was given): a secret
    that happens to be a part of them must not change where outputs go or what a run is called."""
    for name in names:
        if name and len(str(name)) > 1 and str(name) not in _KEPT:
            _KEPT.append(str(name))


@lru_cache(maxsize=16)
def _kept_pattern(kept: tuple[str, ...]) -> re.Pattern[str] | None:
    if not kept:
        return None
    return re.compile("(" + "|".join(re.escape(k) for k in sorted(kept, key=len, reverse=True)) + ")")


@lru_cache(maxsize=64)
def _standalone(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    """One pattern for the short and digits-only values: each where it is not part of a longer word or number
(a digest or a decimal that happens to hold a PIN's digits keeps them)."""
    alts = []
    for s in secrets:
        e = re.escape(s)
        alts.append(rf"(?<!\w)(?<!\d[.,]){e}(?!\w)(?![.,]\d)" if s.isdigit() else rf"(?<!\w){e}(?!\w)")
    return re.compile("|".join(alts)) if alts else None


def _cut_parts(text: str, secret: str) -> str:
    """Remove the heads and tails (PART+ characters) of ``secret`` that an ellipsis or a line end cut off."""
    head, tail = secret[:PART], secret[-PART:]
    spans: list[tuple[int, int]] = []
    i = text.find(head)
    while i >= 0:
        j = i + PART
        while j < len(text) and j - i < len(secret) and text[j] == secret[j - i]:
            j += 1
        if text.startswith(("...", "\u2026"), j) or j == len(text) or text[j] in "\r\n":
            spans.append((i, j))
        i = text.find(head, i + 1)
    i = text.find(tail)
    while i >= 0:
        k, j = i, i + PART
        while k > 0 and j - k < len(secret) and text[k - 1] == secret[len(secret) - (j - k) - 1]:
            k -= 1
        if text.endswith(("...", "\u2026"), 0, k) or k == 0 or text[k - 1] in "\r\n":
            spans.append((k, j))
        i = text.find(tail, i + 1)
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    for start, end in reversed(merged):  # from the end: earlier offsets stay valid
        text = text[:start] + REDACTED + text[end:]
    return text


_LIVE: list[Any] = [None, None]
"""The scrubber of the live environment and the environment it was built from (``Scrubber.from_environment``)."""


class Scrubber:
    """Removes known secret values (and URL credentials, secret ``Name=value`` pairs) from free text."""

    def __init__(self, secrets: list[str], kept: tuple[str, ...] | None = None) -> None:
        forms = [form for s in secrets for form in variants(s.strip())]
        found = {s.strip() for s in forms if len(s.strip()) > 1 and s.strip().lower() not in PLAIN_VALUES}
        found.discard(REDACTED)
        self.kept = _kept_pattern(tuple(_KEPT) if kept is None else kept)
        # Longest first, so a secret containing another is removed whole.
        self.secrets = sorted(found, key=len, reverse=True)
        self.anywhere = [s for s in self.secrets if len(s) >= SHORT and not s.isdigit()]
        self.parts = [s for s in self.secrets if len(s) > PART]
        self.standalone = _standalone(tuple(s for s in self.secrets if len(s) < SHORT or s.isdigit()))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None,
                         extra: Mapping[str, Any] | None = None) -> Scrubber:
        """Secrets = values of secret-named environment variables (and of ``extra``, e.g. metadata)."""
        if environ is None and not extra:
            # The live environment's scrubber, built again only when the environment changed: redacting
            # results.json asks for it at every write, and a test may set a variable between two.
            snapshot = (tuple(os.environ.items()), tuple(_KEPT))
            if _LIVE[0] != snapshot:
                _LIVE[:] = [snapshot, cls._of(os.environ, {})]
            return _LIVE[1]
        return cls._of(os.environ if environ is None else environ, extra or {})

    @classmethod
    def _of(cls, environ: Mapping[str, str], extra: Mapping[str, Any]) -> Scrubber:
        found = [v for k, v in environ.items() if is_secret_name(k, environ)]
        found += [s for v in environ.values() for s in embedded_secrets(v)]
        found += _secret_values(extra)
        return cls(found)

    def _around_kept(self, text: str, scrub: Any) -> str:
        """``scrub`` applied to every part of ``text`` but the kept names in it."""
        parts = self.kept.split(text) if self.kept is not None else [text]
        if len(parts) == 1:
            return scrub(text)
        return "".join(part if i % 2 else scrub(part) for i, part in enumerate(parts))

    def __call__(self, text: str) -> str:
        """Every rule: a text that is one message, log or value (not a page of markup and script)."""
        return self._around_kept(text, self._text)

    def _text(self, text: str) -> str:
        text = self._markup(text)
        if self.standalone is not None:
            text = self.standalone.sub(REDACTED, text)
        return _pairs(text)

    def in_markup(self, text: str) -> str:
        """What is safe on a whole written page (HTML with its script, XML): the long secret values, their cut
        heads and tails, URL userinfo. Short values and ``Name=value`` pairs would match a page's own numbers
        and attributes: every text placed on the page was scrubbed whole before (``__call__``)."""
        return self._around_kept(text, self._markup)

    def _markup(self, text: str) -> str:
        for secret in self.anywhere:
            if secret in text:
                text = text.replace(secret, REDACTED)
        for secret in self.parts:
            if secret[:PART] in text or secret[-PART:] in text:
                text = _cut_parts(text, secret)
        return URL_USERINFO.sub(_url, text)


def redact(data: Any, scrub: Scrubber | None = None) -> Any:
    """A copy of JSON-like ``data``: strings under secret-looking keys replaced, every other string scrubbed.

    Numbers stay whatever their key (``tokens_per_s`` is a figure, not a token).
    """
    scrub = Scrubber.from_environment() if scrub is None else scrub

    def walk(value: Any, secret: bool) -> Any:
        if isinstance(value, Mapping):
            return {scrub(k) if isinstance(k, str) else k: walk(v, secret or is_secret_name(str(k)))
                    for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v, secret) for v in value]
        if isinstance(value, str):
            return REDACTED if secret else scrub(value)
        return value

    return walk(data, False)


def outgoing(obj: Any) -> Any:
    """``obj`` as it may leave this rank for the others (control exchanges, the rendezvous store): scrubbed of
    this rank's own secrets, which no other rank can know to scrub (``scrub_strings``)."""
    return scrub_strings(obj, Scrubber.from_environment())


def scrub_strings(obj: Any, scrub: Scrubber) -> Any:
    """A copy of ``obj`` with every string in it (dataclass fields, mapping keys and values, sequences) scrubbed.
    Unlike ``redact``, no key hides its value: shapes, types and numbers are kept for the logic that reads them;
    what cannot be copied stays as it is."""
    seen: dict[int, Any] = {}

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return scrub(value)
        if value is None or isinstance(value, (int, float, bytes, bool)):
            return value
        if id(value) in seen:
            return seen[id(value)]
        if isinstance(value, Mapping):
            out: Any = {walk(k): walk(v) for k, v in value.items()}
        elif isinstance(value, tuple) and hasattr(value, "_fields"):
            out = type(value)(*(walk(v) for v in value))
        elif isinstance(value, (list, tuple, set, frozenset)):
            out = type(value)(walk(v) for v in value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            try:
                out = copy.copy(value)
                for f in dataclasses.fields(value):
                    object.__setattr__(out, f.name, walk(getattr(value, f.name)))
            except Exception:
                out = value
        else:
            out = value
        seen[id(value)] = out
        return out

    return walk(obj)


def redact_mapping(data: Mapping[str, Any]) -> dict[str, Any]:
    """``redact`` for a mapping (the report's metadata and environment tables)."""
    return redact(dict(data))


def shown_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment variables worth showing (``SHOWN_ENV_PREFIXES``), secrets redacted."""
    environ = os.environ if environ is None else environ
    chosen = {k: v for k, v in sorted(environ.items()) if k.startswith(SHOWN_ENV_PREFIXES)}
    return redact(chosen, Scrubber.from_environment(environ))


def scrub_file(path: Path, scrub: Scrubber | None = None) -> bool:
    """Scrub a written page in place (junit.xml, report.html): ``Scrubber.in_markup``; True if it held a secret."""
    scrub = Scrubber.from_environment() if scrub is None else scrub
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    clean = scrub.in_markup(text)
    if clean == text:
        return False
    write_atomic(path, clean)  # through a random temporary name: no link planted as X.tmp is followed
    return True


class ScrubbingStream:
    """A text stream that scrubs what is written through it (the terminal of every rank)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        self._inner.write(Scrubber.from_environment()(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _secret_values(data: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in data.items():
        if isinstance(value, Mapping):
            out += _secret_values(value)
        elif is_secret_name(str(key)) and isinstance(value, str):
            out.append(value)
        elif isinstance(value, str):
            out += embedded_secrets(value)
    return out
