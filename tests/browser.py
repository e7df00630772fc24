"""Debian's Chromium, headless, as the browser tests drive it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def chromium() -> str:
    found = shutil.which("chromium")
    assert found, "Debian's chromium is not installed: `make test` installs it (scripts/install-services)"
    return found


def headless_chromium(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run Chromium on ``url`` (an argument list, no shell) with a private profile and no background network.

    Without the background-networking flags, this machine's closed network refuses Chromium's own
    connections, many at a time.
    """
    argv = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        *args,
        url,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
