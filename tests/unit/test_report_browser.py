"""The HTML reports in a real browser: headless Chromium at 1,280 px, nothing wider than that.

Tools tier (`--with-tools`): each report is opened twice, once for a screenshot (kept under
.test-output/report-screenshots/, the path printed) and once with a script that writes the
page's widths into the DOM (`--dump-dom`), which the test reads back. Chromium is Debian's
(`hack/install-deps.sh --tools`, which `make test` runs); without it the test skips, except
under CI=true where it fails.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import report_states

from kvgate import report

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = Path(os.environ.get("KVGATE_TEST_OUTPUT") or ROOT / ".test-output")
WIDTH = 1280
NOW = dt.datetime(2026, 12, 1, 10, 12, 30, tzinfo=dt.UTC)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.tools,
    pytest.mark.skipif(
        CHROMIUM is None and not IN_CI,
        reason="no chromium on PATH: `hack/install-deps.sh --tools` (apt-get install chromium)",
    ),
]

# Writes the page's widths into the DOM once laid out: the document's scroll width, the
# viewport's, and every element whose right edge passes the viewport (tag.class: right edge).
_PROBE = """<script>
window.addEventListener("load", () => {
  const wide = [];
  for (const el of document.querySelectorAll("body *")) {
    const right = el.getBoundingClientRect().right;
    if (right > window.innerWidth + 0.5) {
      wide.push(el.tagName.toLowerCase() + (el.className ? "." + el.className : "") + ": " +
                Math.round(right));
    }
  }
  const out = document.createElement("pre");
  out.id = "kvgate-widths";
  out.textContent = JSON.stringify({scrollWidth: document.documentElement.scrollWidth,
                                    innerWidth: window.innerWidth, wide: wide.slice(0, 20)});
  document.body.appendChild(out);
});
</script>"""


def _chromium(*args: str, width: int = WIDTH) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None, "chromium is not installed: hack/install-deps.sh --tools"
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--no-first-run", "--disable-extensions", f"--window-size={width},2000", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("state", sorted(report_states.STATES))
def test_the_report_fits_a_1280_px_window(state: str, tmp_path: Path) -> None:
    page = report.render_html(report_states.STATES[state](), now=NOW)
    assert "<script" not in page  # the report itself stays script-free
    shots = OUTPUT / "report-screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    html = shots / f"{state}.html"
    html.write_text(page)
    png = shots / f"{state}.png"
    png.unlink(missing_ok=True)
    shot = _chromium(f"--screenshot={png}", html.as_uri())
    assert png.is_file() and png.stat().st_size > 0, shot.stderr[-2000:]
    print(f"screenshot of the {state} report: {png}")

    probed = tmp_path / f"{state}.html"
    probed.write_text(page.replace("</body>", _PROBE + "</body>"))
    dom = _chromium("--dump-dom", probed.as_uri())
    found = re.search(r'<pre id="kvgate-widths">(.*?)</pre>', dom.stdout, re.S)
    assert found is not None, f"no widths in the DOM: {dom.stderr[-2000:]}"
    widths = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert widths["innerWidth"] == WIDTH
    assert widths["scrollWidth"] <= WIDTH, f"{state}: wider than {WIDTH} px: {widths['wide']}"
    assert widths["wide"] == []


# Writes into the DOM every word of a table cell that the layout broke over two lines: a Range
# over the word has one client rect per line box it spans (first-hour-2 N1: "Successfu" / "l").
# Cells of class "long" (messages, log lines, remedies) may break a word; the others may not
# (a break after a hyphen, as in "attention-/build-failed", is a line break, not a broken word).
_BROKEN_WORDS = """<script>
window.addEventListener("load", () => {
  const broken = [];
  for (const cell of document.querySelectorAll("td:not(.long), th")) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.data.matchAll(/[^\\s-]+/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
        if (tops.size > 1) broken.push(m[0]);
      }
    }
  }
  const out = document.createElement("pre");
  out.id = "kvgate-broken";
  out.textContent = JSON.stringify(broken.slice(0, 20));
  document.body.appendChild(out);
});
</script>"""


@pytest.mark.parametrize("width", [1280, 800])
@pytest.mark.parametrize("state", ["l4-crash", "promoted", "regressed"])
def test_no_word_breaks_in_a_short_column(state: str, width: int, tmp_path: Path) -> None:
    assert state in report_states.STATES
    page = report.render_html(report_states.STATES[state](), now=NOW)
    probed = tmp_path / f"{state}.html"
    probed.write_text(page.replace("</body>", _BROKEN_WORDS + "</body>"))
    dom = _chromium("--dump-dom", probed.as_uri(), width=width)
    found = re.search(r'<pre id="kvgate-broken">(.*?)</pre>', dom.stdout, re.S)
    assert found is not None, f"no probe output in the DOM: {dom.stderr[-2000:]}"
    assert json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&")) == []
