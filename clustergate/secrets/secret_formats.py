"""Secrets found by what they look like, whatever name (if any) they came under.

A token of a known format (an AWS access key id, a GitHub or GitLab token, a Slack token or webhook, a JWT,
a Stripe, SendGrid, Twilio, npm or PyPI token, an Azure storage key, ...) is a secret wherever it stands: in
an assertion message, a captured log, an NCCL variable's value. The formats come from detect-secrets
(Yelp's maintained catalogue, Apache-2.0, offline: its plugins' patterns are used, never their network
``verify``), every regex-based plugin it ships but those ``LEFT_OUT`` says why; ``OWN`` adds what it lacks.

``find(text)`` gives the secret values a text holds; ``clustergate.secrets.redact`` scrubs them, with every form
they take (escaped, cut short by pytest), from every output. Hex digests, UUIDs, serials, host names and
figures match no format: they stay readable.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache

LEFT_OUT = (
    ("IPPublicDetector", "an address is no secret: hosts and their addresses stay readable in a report"),
    ("PrivateKeyDetector", "it finds a key's first line only; PRIVATE_KEY below takes the whole block"),
    ("BasicAuthDetector",
     "clustergate.secrets.redact.URL_USERINFO takes the userinfo of every URL, user:password@ too"),
)
"""detect-secrets' regex-based plugins not used, and why. (Its other plugins are not regex-based and are never
used: the keyword plugin reads source code lines, the high-entropy ones would take every digest and base64
figure of a report.)"""

MIN_VALUE = 8
"""A format's value is at least this long (its shortest, an AWS key id, has 20 characters): a captured group
shorter than this is a prefix the pattern names (GitHub's ``ghp``), and the whole match is the secret."""

_LINE_BREAK = r"(?:\r?\n|\\+[nr]|&#1[03];|&#x[aAdD];)"
"""A line break as a text carries it: itself, escaped once or more (a key inside a JSON string inside a JSON
string), or as an XML character reference (junit.xml's attributes)."""
_KEY_BODY = rf"(?:[A-Za-z0-9+/=:,\- \t]|{_LINE_BREAK})"
"""What a private key's block holds after its first line: base64 lines, ``Proc-Type: 4,ENCRYPTED`` headers,
and pytest's diff prefixes (``E   + ``) where a diff shows the key line by line."""
_KEY_MARK = r"-{{4,5}} ?{what} [A-Z0-9 ]{{0,40}}PRIVATE KEY(?: BLOCK)? ?-{{4,5}}"

PRIVATE_KEY = re.compile(
    _KEY_MARK.format(what="BEGIN") + rf"(?:{_KEY_BODY}{{0,65536}}?" + _KEY_MARK.format(what="END") +
    rf"|{_KEY_BODY}{{0,65536}})")
"""A private key's block (PEM, OpenSSH, PGP, SSH2), through its END line; a block cut short (pytest shortens
long values) up to where its body ends."""


@dataclass(frozen=True, slots=True)
class Format:
    """One token format: its pattern and, for a library plugin, the plugin's own check of a match."""

    name: str
    pattern: re.Pattern[str]
    confirm: Callable[[str], bool] | None = None


OWN = (
    Format("private key block", PRIVATE_KEY),
    Format("GCP API key", re.compile(r"(?<![\w-])AIza[0-9A-Za-z_-]{35}(?![\w-])")),
    Format("GitHub fine-grained token", re.compile(r"(?<!\w)github_pat_[0-9A-Za-z_]{82}(?!\w)")),
    Format("Azure AD client secret",
           re.compile(r"(?<![\w~.-])[A-Za-z0-9_~.-]{3}\dQ~[A-Za-z0-9_~.-]{31,34}(?![\w~.-])")),
    Format("Slack app token", re.compile(r"(?<![\w-])xapp-\d-[A-Z0-9]+-\d+-[a-z0-9]+(?![\w-])")),
    Format("Hugging Face token", re.compile(r"(?<![\w-])hf_[A-Za-z0-9]{34}(?![\w-])")),
)
"""Formats detect-secrets 1.5 lacks: a private key's whole block, GCP API keys, GitHub's fine-grained tokens,
Azure AD client secrets, Slack app tokens, Hugging Face tokens (the models' hub: HF_TOKEN)."""


def _confirm_with(plugin: object) -> Callable[[str], bool]:
    def confirm(text: str) -> bool:
        # The plugin's own reading of the match (its JWT plugin checks that the parts decode).
        return any(True for _ in plugin.analyze_string(text))  # type: ignore[attr-defined]
    return confirm


@lru_cache(maxsize=1)
def formats() -> tuple[Format, ...]:
    """Every format: detect-secrets' regex-based plugins (less ``LEFT_OUT``), then ``OWN``."""
    # Imported here: only a process that scrubs pays for it (about 0.1 s, requests included).
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import RegexBasedDetector

    found = []
    for plugin_class in sorted(get_mapping_from_secret_type_to_class().values(), key=lambda c: c.__name__):
        if not issubclass(plugin_class, RegexBasedDetector) or plugin_class.__name__ in dict(LEFT_OUT):
            continue
        plugin = plugin_class()
        found += [Format(plugin_class.secret_type, pattern, _confirm_with(plugin)) for pattern in plugin.denylist]
    return (*found, *OWN)


_DELIMITERS = " \t\r\n\"'`=:,;"
_ENDS = re.compile(r"[\s\"'`<>]")
_TOKEN = re.compile(r"[A-Za-z0-9_\-+/=.~]*")


def _value(m: re.Match[str], fmt: Format) -> tuple[int, int]:
    """Where the secret is in a match: the longest captured group, unless it is a named prefix (shorter than
    ``MIN_VALUE``); without the delimiters some patterns take along (``(?:\\s|=|:|"|^)AKC...``), never past a
    quote or a space (npm's ``_authToken=\\s*(npm_.+)`` would run to the end of the line), and on to the end of
    the token it starts (the JWT pattern's lazy end stops before the signature)."""
    start, end = m.span()
    text = m.string
    if fmt.pattern is PRIVATE_KEY:  # a key's block: its body may end on a line break, which is no part of it
        while end > start and text[end - 1] in " \t\r\n":
            end -= 1
        return start, end
    if m.re.groups:
        spans = [m.span(g) for g in range(1, m.re.groups + 1) if m.group(g)]
        if spans and (longest := max(spans, key=lambda s: s[1] - s[0]))[1] - longest[0] >= MIN_VALUE:
            start, end = longest
    while start < end and text[start] in _DELIMITERS:
        start += 1
    while end > start and text[end - 1] in _DELIMITERS:
        end -= 1
    if cut := _ENDS.search(text, start, end):
        return start, cut.start()
    end = _TOKEN.match(text, end).end()  # type: ignore[union-attr]  # (it matches the empty string)
    while end > start and text[end - 1] == ".":
        end -= 1
    return start, end


IMAGE_DATA = re.compile(r"data:image/[\w.+-]{1,32};base64,[A-Za-z0-9+/=]{64,}")
"""An image inside a page (report.html's figures: most of its bytes). Its payload is no text anyone wrote, and
no format is looked for in it (scanning it would triple the cost of a report)."""


def windows(text: str) -> Iterator[tuple[int, int]]:
    """The parts of ``text`` that are text: all of it but the payloads of images (``IMAGE_DATA``)."""
    start = 0
    if "data:image/" in text:
        for m in IMAGE_DATA.finditer(text):
            yield start, m.start()
            start = m.end()
    yield start, len(text)


_FLAGS = ((re.IGNORECASE, "i"), (re.MULTILINE, "m"), (re.DOTALL, "s"), (re.VERBOSE, "x"))


PREFILTER_MAX = 4096
"""Texts up to this long are first searched for any format at once (``_any_format``); a longer one (a page) is
searched format by format, which is then cheaper: each pattern on its own skips ahead to its first letters."""


@lru_cache(maxsize=1)
def _any_format() -> re.Pattern[str]:
    """One pattern of every format: a short text none of them matches (nearly every one) costs one search, not
    one per format."""
    return re.compile("|".join(f"(?{''.join(c for flag, c in _FLAGS if f.pattern.flags & flag)}:{f.pattern.pattern})"
                               if any(f.pattern.flags & flag for flag, _ in _FLAGS) else f"(?:{f.pattern.pattern})"
                               for f in formats()))


def spans(text: str) -> Iterator[tuple[int, int, str]]:
    """``(start, end, format)`` of every secret of a known format in ``text``, in no particular order."""
    found = [(begin, end) for begin, end in windows(text)
             if end - begin > PREFILTER_MAX or _any_format().search(text, begin, end)]
    for fmt in formats() if found else ():
        for begin, end in found:
            for m in fmt.pattern.finditer(text, begin, end):
                if fmt.confirm is not None and not fmt.confirm(m.group(0)):
                    continue
                start, stop = _value(m, fmt)
                if stop - start >= MIN_VALUE:
                    yield start, stop, fmt.name


def find(text: str) -> list[str]:
    """The secret values of a known format in ``text``, each once, longest first."""
    return sorted({text[start:end] for start, end, _ in spans(text)}, key=len, reverse=True)
