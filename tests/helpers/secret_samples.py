"""Secrets of every format redaction finds by value, made up at run time (no token stands in the source).

``tokens(tag)`` gives one of each format, ``in_context(tag)`` one of each kind of text that names its secret
(``--password=X``, ``"password": "X"``, ``user:password@``); another ``tag`` gives other values, so a run can
plant one set in its environment and another in its tests' messages. Each is the text planted and its own
part (``Planted.own``: not a format's prefix or a name): no ``WIDTH`` characters of that may stay in an output.
"""

from __future__ import annotations

import base64
import json
import random
import string
from dataclasses import dataclass

ALNUM = string.ascii_letters + string.digits
WIDTH = 10
"""A run of this many characters of a secret's own part found in an output is a leak."""


@dataclass(frozen=True)
class Planted:
    text: str
    """As it is planted: the token, or the text around the secret that names it."""
    own: str
    """The secret's own part of ``text``."""

    def shown_in(self, output: str) -> list[str]:
        """The runs of ``WIDTH`` characters of ``own`` that ``output`` shows."""
        return sorted({self.own[i:i + WIDTH] for i in range(len(self.own) - WIDTH + 1)} & _runs(output))


def _runs(output: str) -> set[str]:
    return {output[i:i + WIDTH] for i in range(len(output) - WIDTH + 1)}


def leaks(output: str, planted: dict[str, Planted]) -> dict[str, list[str]]:
    """Each planted secret that ``output`` still shows a part of, with the parts."""
    runs = _runs(output)
    found = {name: sorted({p.own[i:i + WIDTH] for i in range(len(p.own) - WIDTH + 1)} & runs)
             for name, p in planted.items()}
    return {name: shown for name, shown in found.items() if shown}


def _rand(rng: random.Random, n: int, alphabet: str = ALNUM) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _b64url(data: dict[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def _prefixed(prefix: str, own: str, suffix: str = "") -> Planted:
    return Planted(prefix + own + suffix, own)


def tokens(tag: str) -> dict[str, Planted]:
    """One secret of each format, different for each ``tag``."""
    rng = random.Random(tag)
    lower, upper = string.ascii_lowercase + string.digits, string.ascii_uppercase + string.digits
    key_lines = ["MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" + _rand(rng, 32, ALNUM + "+/") for _ in range(4)]
    key = "-----BEGIN PRIVATE KEY-----\n" + "\n".join(key_lines) + "\n-----END PRIVATE KEY-----"
    header, payload = _b64url({"alg": "HS256", "typ": "JWT"}), _b64url({"sub": _rand(rng, 12), "tag": tag})
    jwt_signature = _rand(rng, 43, ALNUM + "-_")
    slack = f"{_rand(rng, 12, string.digits)}-{_rand(rng, 13, string.digits)}-{_rand(rng, 24, lower)}"
    return {
        "AWS access key id": _prefixed("AKIA", _rand(rng, 16, upper)),
        "AWS secret access key": _prefixed("aws_secret_access_key='", _rand(rng, 40, ALNUM + "/+"), "'"),
        "GitHub token": _prefixed("ghp_", _rand(rng, 36)),
        "GitHub fine-grained token": _prefixed("github_pat_", _rand(rng, 22) + "_" + _rand(rng, 59)),
        "GitLab token": _prefixed("glpat-", _rand(rng, 20)),
        "Slack token": _prefixed("xoxb-", slack),
        "Slack webhook": _prefixed("https://hooks.slack.com/services/", f"T{_rand(rng, 8)}/B{_rand(rng, 8)}/"
                                   f"{_rand(rng, 24)}"),
        "JWT": Planted(f"{header}.{payload}.{jwt_signature}", f"{payload}.{jwt_signature}"),
        "private key": Planted(key, "".join(line[32:] for line in key_lines)),
        "GCP API key": _prefixed("AIza", _rand(rng, 35, ALNUM + "_-")),
        "Azure storage key": _prefixed("AccountKey=", _rand(rng, 86, ALNUM + "+/"), "=="),
        "Azure AD client secret": _prefixed("", _rand(rng, 3) + "8Q~" + _rand(rng, 34, ALNUM + "_~.-")),
        "Stripe key": _prefixed("sk_live_", _rand(rng, 24)),
        "SendGrid key": _prefixed("SG.", f"{_rand(rng, 22)}.{_rand(rng, 43)}"),
        "Hugging Face token": _prefixed("hf_", _rand(rng, 34)),
    }


def in_context(tag: str) -> dict[str, Planted]:
    """Secrets that only the text around them names: a command line's option, a JSON or dict key, a URL's
    userinfo, a JSON string inside a JSON string."""
    rng = random.Random("context " + tag)
    pw = [f"pw-{_rand(rng, 16)}" for _ in range(6)]
    return {
        "--password=X": Planted(f"--password={pw[0]}", pw[0]),
        "--token X": Planted(f"--token {pw[1]}", pw[1]),
        '"password": "X"': Planted(json.dumps({"password": pw[2]}), pw[2]),
        "user:password@": Planted(f"https://ops:{pw[3]}@store.example/bucket", pw[3]),
        "JSON in a JSON string": Planted(json.dumps({"config": json.dumps({"secret": pw[4]})}), pw[4]),
        "-Dpassword=X": Planted(f"java -Dpassword={pw[5]} -jar tool.jar", pw[5]),
    }


def everything(tag: str) -> dict[str, Planted]:
    return {**tokens(tag), **in_context(tag)}
