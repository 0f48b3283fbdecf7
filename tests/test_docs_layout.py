"""The planning guide's console blocks fit a 1280 px screen: none scrolls sideways (they ran off the
block before: recommendation lines of 230 characters in a column of about 80)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_the_site_styles_console_blocks_to_wrap():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text().split("\nhooks:")[0])
    assert "stylesheets/extra.css" in config["extra_css"]
    css = (ROOT / "docs" / "stylesheets" / "extra.css").read_text()
    assert "white-space: pre-wrap" in css


def test_planning_guide_blocks_do_not_overflow_at_1280px(tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is not installed; `make test` installs it (apt-get install chromium)")
        pytest.skip("no Chromium on this machine")
    sync_api = pytest.importorskip("playwright.sync_api")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto((site / "planning-guide" / "index.html").as_uri())
        widths = page.evaluate(
            "() => Array.from(document.querySelectorAll('pre > code'))"
            ".map(c => [c.scrollWidth, c.clientWidth])"
        )
        browser.close()
    assert widths and all(scroll <= client + 1 for scroll, client in widths), widths
