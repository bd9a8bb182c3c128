"""Headless Chromium as the report's tests run it: offline (a proxy that refuses every connection), its
network log and console read back."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
         "--disable-default-apps", "--no-default-browser-check", "--disable-domain-reliability", "--no-pings",
         "--proxy-server=127.0.0.1:9", "--enable-logging=stderr", "--v=1"]
"""No sandbox (CI runs as root), no GPU, no background services, and a proxy on the discard port that
refuses every connection: a page that needs the network would render incomplete."""

BROWSER_SERVICES = re.compile(r"^https?://([\w.-]+\.)?(google\.com|googleapis\.com|gstatic\.com|gvt1\.com)(/|$)")
"""Chromium's own background requests (sign-in, component updates), logged beside the page's even with
the flags above; they never leave the machine (the proxy refuses them) and are not the report's."""

RESOURCE_ATTR = re.compile(r"""<(?!a[\s>])(\w+)[^>]*?\b(?:src|href|srcset|poster|data)\s*=\s*["']?\s*(https?:)?//""",
                           re.IGNORECASE)
CSS_URL = re.compile(r"""url\(\s*["']?\s*(https?:)?//|@import\s+["']?(https?:)?//""", re.IGNORECASE)


def chromium(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHROMIUM or "chromium", *FLAGS, f"--user-data-dir={profile}", *args, url],
                          capture_output=True, text=True, timeout=120)


def page_requests(log: str) -> list[str]:
    urls = re.findall(r"NotifyBeforeURLRequest: (\S+)", log)
    return [u for u in urls if not BROWSER_SERVICES.match(u) and not u.startswith(("file:", "data:"))]


def console_errors(log: str) -> list[str]:
    lines = [line for line in log.splitlines() if ":CONSOLE" in line]
    return [line for line in lines if re.search(r"error|uncaught|failed|refused|not allowed", line, re.IGNORECASE)]
