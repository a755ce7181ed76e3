"""Headless Chromium for the tests that open pages (the HTML tree view, Mermaid).

The Debian ``chromium`` that ``.ci/run`` installs is driven through the Python
``playwright`` package; no browser is ever downloaded. Tests skip with the reason
when either is missing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("MEMTREE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium_path() -> str | None:
    if Path(CHROMIUM).is_file():
        return CHROMIUM
    return shutil.which("chromium")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium browser (module-scoped: starting one takes a second)."""
    executable = chromium_path()
    if executable is None:
        pytest.skip("Chromium is not installed (apt-get install chromium; .ci/run installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()
