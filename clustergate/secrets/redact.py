r"""The one redaction: no secret reaches any output (results.json, progress.jsonl, junit.xml,
report.html, metrics.prom, the terminal, the merged and sign-off records), the results store
(``redact_by_value``) or an evidence bundle (``scrub_output``), from any rank.

A secret is
- the value of an environment variable whose name looks secret (``is_secret_name``: TOKEN, KEY, SECRET,
  PASSWORD, CREDENTIAL, AUTH, *PASS, *PW, *CREDS, *DSN, *CONNECTION_STRING, *WEBHOOK*, ... in any case)
  or is named in the site's own list ``CLUSTERGATE_REDACT_VARS`` (comma-separated names or patterns);
- a value of a known format, whatever its name (``clustergate.secrets.secret_formats``: detect-secrets' token
  formats, a private key's block, ...);
- the userinfo of a URL (``https://user:password@host``, ``https://TOKEN@host``, ``http://:pw@host``);
- the value of a ``Name=value``, ``Name: value`` or ``"name": "value"`` pair (at any depth of escaping) or of a
  ``--name value`` option inside a text whose name looks secret (``AccountKey=...;``, ``password=...``,
  ``?sig=...&``, ``password: ...``, ``Authorization: Basic ...``, ``{\"password\": \"...\"}``,
  ``--token ...``) and the credential after ``Bearer``; the text loses it wherever else it shows it, and
  such a value, or one of a known format, found inside any environment variable's value or any
  ``--metadata`` value is a known secret from then on, wherever it appears (one of a known format in a
  record, in every string of the record).
Structured data (JSON, mappings) loses the string values under such names; every text loses the
known secret values wherever they appear, so a message or a captured log that quotes a token is
scrubbed too, and so are the 8+ character heads and tails that pytest leaves of a long value it
shortens (``'AKIAIOSF...AMPLEKEY'``), every line of a secret of several lines (a PEM key: pytest's
assertion diff shows it line by line), and a secret as ``repr``, JSON or HTML escapes it, up to three times
over. Over-redacting a harmless variable costs nothing; a leak does.

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
import html
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import lru_cache
from typing import Any

from clustergate.secrets import secret_formats

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
    r"(?<![a-z0-9+.-])(?P<scheme>[a-z][a-z0-9+.-]{0,31}:(?:\\{0,8}/){2})"
    r"(?:[^\s@/:\"'<>]{0,256}:[^\s\"'<>]{0,512}|[^\s@/:\"'<>]{1,256})@",
    re.IGNORECASE)
r"""The userinfo of a URL is a credential: ``user:password@`` (the password may hold ``@`` and ``/``: up to the
last ``@`` of the word), ``:password@``, ``TOKEN@``; its slashes may be escaped (``https:\/\/``). A userinfo
without ``:`` holds no ``/`` (else ``https://registry.example/@scope/pkg`` would lose its host). Bounded and
anchored at the start of a word: unbounded, it backtracks through every base64 figure of report.html (6.5 s
for 4 MB, 0.1 s so)."""

_QUOTE = r"\\{0,8}(?:['\"]|&#x27;|&#39;|&#34;|&quot;)"
"""A quote as a text carries it: itself, backslash-escaped (a JSON string inside a JSON string, any depth), or
HTML-escaped."""
_VALUE = r"(?:[^\s;&\"'<>,\\]|\\(?!\\{0,8}['\"]))+"
r"""An unquoted value: up to a space, a separator or a quote (an escaped quote too: ``password=\"X\"``)."""

SECRET_PAIR = re.compile(rf"(?<![\w.+/=-])(?P<name>[A-Za-z_][\w.-]{{0,63}})(?P<sep>[ \t]*=[ \t]*)"
                         rf"(?P<quote>{_QUOTE}|)(?P<value>(?!=){_VALUE})")
"""``Name=value`` inside a text (connection strings, query strings, command lines, an AWS credentials file's
``aws_secret_access_key = ...``): the value goes when the name looks secret (``AccountKey=``,
``SharedAccessKey=``, ``Password=``, ``sig=``); quoted too, escaped too."""

COLON_PAIR = re.compile(
    rf"(?<![\w.+/=-])(?P<name>[A-Za-z_][\w.-]{{0,63}})(?P<sep>[ \t]*:[ \t]*)(?P<quote>{_QUOTE}|)"
    rf"(?P<scheme>(?:bearer|basic|digest|negotiate|token)[ \t]+)?(?P<value>{_VALUE})", re.IGNORECASE)
"""``Name: value`` inside a text (an HTTP header, a YAML or log line): the value goes when the name looks secret
(``Authorization: Bearer ...``, ``password: ...``, ``X-Api-Key: ...``); an authentication scheme stays."""

QUOTED_PAIR = re.compile(
    rf"(?P<quote>{_QUOTE})(?P<name>[A-Za-z_][\w.-]{{0,63}})(?P=quote)(?P<sep>[ \t]*[:=][ \t]*)"
    rf"(?P<vquote>{_QUOTE})(?P<value>[^\n]{{1,1024}}?)(?P=vquote)")
r"""``"name": "value"`` (JSON, a Python dict's repr, ``'name'='value'``) inside a text, at any depth of escaping
(``{\"password\": \"X\"}``, ``&#34;token&#34;: &#34;X&#34;``): the value goes when the name looks secret."""

OPTION = re.compile(
    rf"(?<![\w-])(?P<dash>--|-(?=[A-Za-z][\w.-]*=))(?P<name>[A-Za-z][\w.-]{{1,63}})(?P<sep>=|[ \t]+)"
    rf"(?:(?P<quote>{_QUOTE})(?P<quoted>[^\n]{{1,1024}}?)(?P=quote)|(?P<value>(?![-=]){_VALUE}))")
"""A command line's option: ``--password=X``, ``--token X``, ``--api-key 'X'``, ``-Dpassword=X``: the value goes
when the option's name looks secret (not one that names a file: ``--key-file PATH`` keeps the path)."""
NAMES_A_PATH = re.compile(r".*[_.-](file|path|dir)", re.IGNORECASE)

NOT_A_SECRET_KEY = re.compile(r".*(error|exception|warning|tokens|keys)", re.IGNORECASE)
"""``KeyError: 'x'``, ``tokens: 4096``: a colon after such a name starts a message or a count, not a secret."""
MAY_NAME_A_SECRET = re.compile(r"[=:]|--|bearer", re.IGNORECASE)
"""What a text that names a secret holds (a pair's ``=`` or ``:``, an option's ``--``, ``Bearer``): a text without
any (a host, a unit, most of a record's strings) is not read for pairs at all."""
MEMO_TEXT, MEMO_TEXTS = 1 << 16, 1 << 16
"""A scrubber remembers what it made of texts up to this long, this many at most."""
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
                      "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GLOO_", "CLUSTERGATE_", "PYTHONPATH", "PYTEST_")
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


def _named(m: re.Match[str]) -> bool:
    """A pair whose name looks secret (and whose value is not redacted already)."""
    return is_secret_name(m.group("name")) and m.group("value") != REDACTED


def _named_not_a_count(m: re.Match[str]) -> bool:
    return _named(m) and not NOT_A_SECRET_KEY.fullmatch(m.group("name"))


def _secret_option(m: re.Match[str]) -> bool:
    name = m.group("name")
    return (is_secret_name(name) and not NAMES_A_PATH.fullmatch(name) and not NOT_A_SECRET_KEY.fullmatch(name)
            and (m.group("quoted") or m.group("value")) != REDACTED)


PairRule = tuple[re.Pattern[str], Callable[[re.Match[str]], bool], Callable[[re.Match[str]], str]]

PAIRS: tuple[PairRule, ...] = (
    (QUOTED_PAIR, _named_not_a_count, lambda m: f"{m['quote']}{m['name']}{m['quote']}{m['sep']}{m['vquote']}"
                                                f"{REDACTED}{m['vquote']}"),
    (OPTION, _secret_option, lambda m: f"{m['dash']}{m['name']}{m['sep']}{m['quote'] or ''}{REDACTED}"
                                       f"{m['quote'] or ''}"),
    (SECRET_PAIR, _named, lambda m: f"{m['name']}{m['sep']}{m['quote']}{REDACTED}"),
    (COLON_PAIR, _named_not_a_count, lambda m: f"{m['name']}{m['sep']}{m['quote']}{m['scheme'] or ''}{REDACTED}"),
)
"""Each way a text names a secret: its pattern, whether a match is a secret, and what the match becomes."""
ON_A_PAGE = PAIRS[:2]
"""What of ``PAIRS`` is safe on a whole page: names in quotes and options, whose punctuation no page uses for its
own attributes, numbers and script (``key = 'x'`` in a page's script is code)."""


def _secret_pairs(pattern: re.Pattern[str], text: str, secret: Callable[[re.Match[str]], bool]
                  ) -> Iterator[re.Match[str]]:
    """The matches of ``pattern`` that are secrets. After one that is not, the text is read on from the end of its
    name, not of its value: the value may hold a pair of its own (``{'said': '{"password": "X"}'}``)."""
    pos = 0
    while (m := pattern.search(text, pos)) is not None:
        if secret(m):
            yield m
            pos = m.end()
        else:
            pos = m.end("name")


def _replace_pairs(text: str, rules: tuple[PairRule, ...]) -> str:
    for pattern, secret, replacement in rules:
        pieces, last = [], 0
        for m in _secret_pairs(pattern, text, secret):
            pieces += [text[last:m.start()], replacement(m)]
            last = m.end()
        text = "".join(pieces) + text[last:] if pieces else text
    return text


def _bearer(m: re.Match[str]) -> str:
    return m.group(0) if m.group("value") == REDACTED else f"{m.group('scheme')}{REDACTED}"


def _pairs(text: str) -> str:
    """The values of secret-named ``"name": "value"``, ``--name value``, ``Name=value`` and ``Name: value``, and
    ``Bearer`` credentials."""
    return BEARER.sub(_bearer, _replace_pairs(text, PAIRS))


def _quoted_values(text: str) -> str:
    """``_pairs`` as a whole page allows (``ON_A_PAGE``)."""
    return _replace_pairs(text, ON_A_PAGE)


def named_secrets(text: str) -> list[str]:
    """The secret values the text around them names: in secret-named pairs (``token=X``, ``password: X``,
    ``"password": "X"``, ``--password X``), after ``Bearer``, a URL's userinfo."""
    found = [m["quoted"] or m["value"] if pattern is OPTION else m["value"]
             for pattern, secret, _ in PAIRS for m in _secret_pairs(pattern, text, secret)]
    found += [m.group("value") for m in BEARER.finditer(text)]
    for m in URL_USERINFO.finditer(text):
        userinfo = m.group(0)[len(m.group("scheme")):-1]
        found.append(userinfo.split(":", 1)[1] if ":" in userinfo else userinfo)  # a password or a token, not a user
    return [f for f in found if f and f != REDACTED]


def embedded_secrets(text: str) -> list[str]:
    """The secret values a text holds, named (``named_secrets``) or of a known format (``secret_formats``): what a
    variable or a metadata value that is not itself secret may carry."""
    return named_secrets(text) + secret_formats.find(text)


ESCAPE_DEPTH = 3
"""How many times over a secret's escaped forms are scrubbed: a secret inside a JSON string inside a JSON string
(a record quoted in a message, quoted again in a report's data) is escaped twice; one more for good measure."""


def _escaped(text: str) -> set[str]:
    """``text`` as ``repr``, JSON and HTML escape it once (a backslash, a tab, a quote, a newline)."""
    return {repr(text)[1:-1], json.dumps(text)[1:-1], text.encode("unicode_escape").decode("ascii"),
            html.escape(text)}


ARMOR_LINE = re.compile(r"-{4,5} ?(BEGIN|END) [^\n]*-{4,5}|(Proc-Type|DEK-Info): [^\n]*")
"""A key's armor (``-----BEGIN PRIVATE KEY-----``) and headers (``Proc-Type: 4,ENCRYPTED``): every key has the
same; as a known secret they would be taken from another key and leave its body without its bounds."""


def _own_line(line: str) -> bool:
    """A line of a secret of several lines that is its own: not its armor, not punctuation (``==``), which a page
    has too."""
    return len(line) >= 4 and any(c.isalnum() for c in line) and not ARMOR_LINE.fullmatch(line)


def variants(secret: str) -> list[str]:
    """``secret`` and the forms it takes in an output: each line of a value of several lines (pytest's assertion
    diff shows a PEM key line by line), and the value as ``repr``, JSON and HTML escape it, up to ``ESCAPE_DEPTH``
    times over."""
    forms = [secret]
    if "\n" in secret or "\r" in secret:
        forms += [line.strip() for line in secret.splitlines() if _own_line(line.strip())]
    level = {secret}
    for _ in range(ESCAPE_DEPTH):
        level = {escaped for form in level for escaped in _escaped(form)} - {secret}
        forms += sorted(level - set(forms))
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


ELLIPSES = ("...", "\u2026")


def _cut_parts(text: str, secret: str) -> str:
    """Remove the heads and tails (PART+ characters) of ``secret`` that an ellipsis or a line end cut off."""
    head, tail = secret[:PART], secret[-PART:]
    spans: list[tuple[int, int]] = []
    i = text.find(head)
    while i >= 0:
        j = i + PART
        while j < len(text) and j - i < len(secret) and text[j] == secret[j - i]:
            j += 1
        while j > i + PART and text[j - 1] == "." and not text.startswith(ELLIPSES, j):
            j -= 1  # the secret's own dots ran into the ellipsis that cut it ("eyJhbGci.eyJz..." of a JWT)
        # A line end cuts it, unless the secret goes on with an escaped line end there: that is its escaped form.
        escaped_line_end = j - i < len(secret) and secret[j - i] == "\\"
        if text.startswith(ELLIPSES, j) or j == len(text) or (text[j] in "\r\n" and not escaped_line_end):
            spans.append((i, j))
        i = text.find(head, i + 1)
    i = text.find(tail)
    while i >= 0:
        k, j = i, i + PART
        while k > 0 and j - k < len(secret) and text[k - 1] == secret[len(secret) - (j - k) - 1]:
            k -= 1
        while k < j - PART and text[k] == "." and not text.endswith(ELLIPSES, 0, k):
            k += 1
        before = len(secret) - (j - k) - 1  # the secret's character before the part found
        escaped_line_end = before >= 1 and secret[before] in "nr" and secret[before - 1] == "\\"
        if text.endswith(ELLIPSES, 0, k) or k == 0 or (text[k - 1] in "\r\n" and not escaped_line_end):
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
"""The secrets of the live environment (and the kept names) and the scrubber built of them
(``Scrubber.from_environment``)."""


def _environment_secrets(environ: Mapping[str, str]) -> Iterator[str]:
    """The secrets an environment holds: each secret-named variable's value, and what any value holds
    (``embedded_secrets``)."""
    site_list = environ.get(SITE_LIST, "")
    for name, value in environ.items():
        yield from _variable_secrets(name, value, site_list)


@lru_cache(maxsize=1 << 12)
def _variable_secrets(name: str, value: str, site_list: str) -> tuple[str, ...]:
    # Remembered per variable: the live environment is read at every write of an output, and between two
    # writes at most a variable or two changed (pytest's PYTEST_CURRENT_TEST at every phase).
    return ((value,) if _is_secret_name(name, site_list) else ()) + tuple(embedded_secrets(value))


@lru_cache(maxsize=1 << 16)
def _cached_formats(text: str) -> tuple[str, ...]:
    return tuple(secret_formats.find(text))


def formats_in(text: str) -> tuple[str, ...]:
    """The secrets of a known format in ``text`` (``secret_formats``). Remembered for texts up to 64 KB: a record
    is scrubbed again at every write while the run goes on, and most of its strings are the ones it had before."""
    if len(text) < secret_formats.MIN_VALUE:
        return ()
    return _cached_formats(text) if len(text) <= 1 << 16 else tuple(secret_formats.find(text))


class Scrubber:
    """Removes known secret values, secrets of a known format (``secret_formats``), URL credentials and secret
    ``Name=value`` pairs from free text."""

    def __init__(self, secrets: list[str], kept: tuple[str, ...] | None = None, *, scan: bool = True) -> None:
        self.given = [s.strip() for s in secrets]
        forms = [form for s in self.given for form in variants(s)]
        found = {s.strip() for s in forms if len(s.strip()) > 1 and s.strip().lower() not in PLAIN_VALUES}
        found.discard(REDACTED)
        self.kept_names = tuple(_KEPT) if kept is None else kept
        self.kept = _kept_pattern(self.kept_names)
        self.scan = scan  # whether texts are searched for secrets of a known format (not by the one of those found)
        self._done: dict[str, str] = {}  # texts scrubbed before: a record is scrubbed again at every write of it
        self._knowing: dict[tuple[str, ...], Scrubber] = {}
        # Longest first, so a secret containing another is removed whole.
        self.secrets = sorted(found, key=len, reverse=True)
        # Each secret, whether it goes wherever it stands (not short, not digits only), whether cut forms go too.
        self.known = [(s, len(s) >= SHORT and not s.isdigit(), len(s) > PART) for s in self.secrets]
        self.standalone = _standalone(tuple(s for s in self.secrets if len(s) < SHORT or s.isdigit()))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None,
                         extra: Mapping[str, Any] | None = None) -> Scrubber:
        """Secrets = values of secret-named environment variables (and of ``extra``, e.g. metadata)."""
        if environ is None and not extra:
            # The live environment's scrubber, built again only when the secrets it holds changed: redacting
            # results.json asks for it at every write, and a test may set a variable between two. pytest sets
            # PYTEST_CURRENT_TEST at every phase of every test: the same secrets, the same scrubber (and what it
            # remembers of the record's texts).
            secrets = (tuple(_environment_secrets(os.environ)), tuple(_KEPT))
            if _LIVE[0] != secrets:
                _LIVE[:] = [secrets, cls(list(secrets[0]))]
            return _LIVE[1]
        return cls._of(os.environ if environ is None else environ, extra or {})

    @classmethod
    def _of(cls, environ: Mapping[str, str], extra: Mapping[str, Any]) -> Scrubber:
        return cls([*_environment_secrets(environ), *_secret_values(extra)])

    def knowing(self, secrets: Iterable[str]) -> Scrubber:
        """This scrubber, with ``secrets`` (of a known format, found in a record) known too: a token one string
        of a record quotes whole goes from another that shows it cut short (``'eyJhbGci...'``)."""
        found = tuple(sorted(set(secrets) - set(self.given)))
        if not found:
            return self
        if found not in self._knowing:  # the same record written again: the same scrubber, and what it remembers
            if len(self._knowing) >= 8:
                self._knowing.clear()
            self._knowing[found] = Scrubber([*self.given, *found], self.kept_names, scan=self.scan)
        return self._knowing[found]

    def _around_kept(self, text: str, scrub: Any) -> str:
        """``scrub`` applied to every part of ``text`` but the kept names in it."""
        parts = self.kept.split(text) if self.kept is not None else [text]
        if len(parts) == 1:
            return scrub(text)
        return "".join(part if i % 2 else scrub(part) for i, part in enumerate(parts))

    def __call__(self, text: str) -> str:
        """Every rule: a text that is one message, log or value (not a page of markup and script)."""
        done = self._done.get(text)
        if done is None:
            done = self._around_kept(text, self._text)
            if len(text) <= MEMO_TEXT:
                if len(self._done) >= MEMO_TEXTS:
                    self._done.clear()
                self._done[text] = done
        return done

    def _text(self, text: str) -> str:
        # A value the text names as a secret goes wherever the same text shows it: quoted again, cut short.
        may_name = MAY_NAME_A_SECRET.search(text) is not None
        named = tuple(sorted({v for v in named_secrets(text) if len(v) >= SHORT})) if may_name else ()
        clean = self._markup(text)
        if named:
            clean = _scrubber_of(named)._known(clean)
        if self.standalone is not None:
            clean = self.standalone.sub(REDACTED, clean)
        return _pairs(clean) if may_name else clean

    def in_markup(self, text: str) -> str:
        """What is safe on a whole written page (HTML with its script, XML): the long secret values, their cut
        heads and tails, secrets of a known format, URL userinfo, and secret-named values in quotes and options.
        Short values and ``Name=value`` pairs would match a page's own numbers and attributes: every text placed
        on the page was scrubbed whole before (``__call__``). The payloads of its images (its figures, most of
        its bytes) hold no text and are not read."""
        pieces, start = [], 0
        for begin, end in secret_formats.windows(text):  # an image's payload is left as it is: no text is in it
            pieces += [text[start:begin], self._around_kept(text[begin:end], self._page)]
            start = end
        return "".join(pieces)

    def _page(self, text: str) -> str:
        return _quoted_values(self._markup(text))

    def _markup(self, text: str) -> str:
        text = URL_USERINFO.sub(_url, self._known(text))
        # Read as the page shows it: a token quoted as &#x27;...&#x27; is the token (its escaped forms go too).
        if self.scan and (found := formats_in(html.unescape(text) if "&" in text else text)):
            text = _scrubber_of(found)._known(text)
        return text

    def _known(self, text: str) -> str:
        """The known secrets, whole or cut short: longest first, each whole and then its cut heads and tails, so a
        secret that holds another (an access key id inside a longer value) goes whole or cut, never in pieces."""
        for secret, anywhere, cut in self.known:
            if anywhere and secret in text:
                text = text.replace(secret, REDACTED)
            if cut and (secret[:PART] in text or secret[-PART:] in text):
                text = _cut_parts(text, secret)
        return text


@lru_cache(maxsize=64)
def _scrubber_of(found: tuple[str, ...]) -> Scrubber:
    """The scrubber of secrets found by their format: each in every form it takes, whole or cut short."""
    return Scrubber(list(found), (), scan=False)


_PLAIN = frozenset({float, int, bool, type(None)})
"""The exact types a walk keeps whatever the key: checked first, by type, before any isinstance of an ABC."""


def redact(data: Any, scrub: Scrubber | None = None) -> Any:
    """A copy of JSON-like ``data``: strings under secret-looking keys replaced, every other string scrubbed.

    Numbers stay whatever their key (``tokens_per_s`` is a figure, not a token).
    """
    scrub = Scrubber.from_environment() if scrub is None else scrub
    found: set[str] = set()
    site_list = os.environ.get(SITE_LIST, "")  # read once: a record has thousands of keys

    # The bulk of a record is its figures, kept as they are whatever their key: they are let through by their type
    # where they stand, without a call each (a merged record of a thousand nodes holds millions).
    def walk(value: Any, secret: bool) -> Any:
        if isinstance(value, Mapping):
            return {text(k, False) if isinstance(k, str) else k:
                    v if type(v) in _PLAIN else walk(v, secret or _is_secret_name(str(k), site_list))
                    for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [v if type(v) in _PLAIN else walk(v, secret) for v in value]
        if isinstance(value, str):
            return text(value, secret)
        return value

    def text(value: str, secret: bool) -> str:
        if formats := formats_in(value):
            found.update(formats)
        return REDACTED if secret else scrub(value)

    out = walk(data, False)
    # A token a string holds goes from every other string too, cut short or quoted (once more, knowing it).
    if (knowing := scrub.knowing(found)) is not scrub:
        scrub = knowing
        out = walk(data, False)
    return out


def outgoing(obj: Any) -> Any:
    """``obj`` as it may leave this rank for the others (control exchanges, the rendezvous store): scrubbed of
    this rank's own secrets, which no other rank can know to scrub (``scrub_strings``)."""
    return scrub_strings(obj, Scrubber.from_environment())


def scrub_strings(obj: Any, scrub: Scrubber) -> Any:
    """A copy of ``obj`` with every string in it (dataclass fields, mapping keys and values, sequences) scrubbed.
    Unlike ``redact``, no key hides its value: shapes, types and numbers are kept for the logic that reads them;
    what cannot be copied stays as it is."""
    seen: dict[int, Any] = {}
    found: set[str] = set()

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            if formats := formats_in(value):
                found.update(formats)
            return scrub(value)
        if value is None or isinstance(value, (int, float, bytes, bool)):
            return value
        if id(value) in seen:
            return seen[id(value)]
        if isinstance(value, Mapping):
            out: Any = {walk(k): v if type(v) in _PLAIN else walk(v) for k, v in value.items()}
        elif isinstance(value, tuple) and hasattr(value, "_fields"):
            out = type(value)(*(walk(v) for v in value))
        elif isinstance(value, (list, tuple, set, frozenset)):
            out = [v if type(v) in _PLAIN else walk(v) for v in value]  # figures as in ``redact``
            out = out if type(value) is list else type(value)(out)
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

    out = walk(obj)
    if (knowing := scrub.knowing(found)) is not scrub:  # as ``redact`` does
        scrub = knowing
        seen.clear()
        out = walk(obj)
    return out


def redact_mapping(data: Mapping[str, Any]) -> dict[str, Any]:
    """``redact`` for a mapping (the report's metadata and environment tables)."""
    return redact(dict(data))


def shown_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment variables worth showing (``SHOWN_ENV_PREFIXES``), secrets redacted."""
    environ = os.environ if environ is None else environ
    chosen = {k: v for k, v in sorted(environ.items()) if k.startswith(SHOWN_ENV_PREFIXES)}
    return redact(chosen, Scrubber.from_environment(environ))


def redact_by_value(data: Any) -> Any:
    """``redact`` with no environment's secrets, only the rules that need none (secret-named keys and pairs, URL
    userinfo, secrets of a known format): what the results store keeps of a document, the same whichever host
    records it (a document recorded twice stays one record)."""
    return redact(data, Scrubber([]))


def scrub_output(name: str, data: bytes, scrub: Scrubber | None = None) -> bytes:
    """A written output's bytes as they may leave the site (an evidence bundle): a JSON record redacted as data,
    and JSON lines (progress.jsonl) line by line (``redact``), each written again only where that changed it; a
    page or any other text scrubbed as markup (``Scrubber.in_markup``). Bytes that are not UTF-8 stay as they are."""
    scrub = Scrubber.from_environment() if scrub is None else scrub
    text = data.decode("utf-8", "surrogateescape")
    if name.endswith(".json"):
        text = _redacted_json(text, scrub, indent=2)
    elif name.endswith(".jsonl"):
        text = "".join(_redacted_json(line, scrub) for line in text.splitlines(keepends=True))
    else:
        text = scrub.in_markup(text)
    return text.encode("utf-8", "surrogateescape")


def _redacted_json(text: str, scrub: Scrubber, indent: int | None = None) -> str:
    """One JSON document's text, redacted (``redact``): the same text where nothing in it is secret, and scrubbed
    as markup where it is no JSON."""
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return scrub.in_markup(text)
    clean = redact(parsed, scrub)
    return text if clean == parsed else json.dumps(clean, indent=indent) + text[len(text.rstrip()):]


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
