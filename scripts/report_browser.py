"""Open a report page in headless Chromium and check it as a reader would see it.

    python scripts/report_browser.py                 # the default job (`opsplit`), screenshots
                                                     # to docs/figures/report_*.png
    python scripts/report_browser.py --quick         # the same on `opsplit --quick`
    python scripts/report_browser.py --page DIR/report.html --out /tmp/shots

:func:`check_page` loads the page at 1280 x 800 pixels (a laptop screen) through the
DevTools protocol over a pipe (``--remote-debugging-pipe``: no port, no network, no Python
dependency), waits for every image, and returns what it measured: images that did not load,
whether the findings come before the first table (in the document and on the screen), the
horizontal overflow with the tables folded and unfolded, internal links without a target;
:func:`problems` turns that into a list of failures.  It writes PNG screenshots of the top
of the page and of named sections.  tests/test_report.py runs it on ``opsplit --quick``'s
report; this script, on the default job's, makes the screenshots of docs/report.md.

Chromium: Debian's ``chromium`` package (``apt-get install chromium``; .ci/run installs it),
or ``OPSPLIT_CHROMIUM=/path/to/chrome``.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH, HEIGHT = 1280, 800

#: run in the page once it has loaded; returns what :func:`check_page` reports
CHECK_JS = r"""
(async () => {
  const imgs = Array.from(document.images);
  await Promise.all(imgs.map(i => i.complete ? null :
    new Promise(r => { i.addEventListener('load', r); i.addEventListener('error', r); })));
  await Promise.all(imgs.map(i => (i.complete && i.naturalWidth > 0 && i.decode) ? i.decode().catch(() => null) : null));
  const broken = imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => {
    const s = i.getAttribute('src') || '';
    return s.startsWith('data:') ? 'embedded ' + (i.getAttribute('data-file') || 'image') : s.slice(0, 200); });
  const de = document.documentElement;
  const overflow = () => de.scrollWidth - de.clientWidth;
  const findings = document.getElementById('findings');
  const details = Array.from(document.querySelectorAll('details'));
  const wasOpen = details.map(d => d.open);
  const overflowFolded = overflow();
  const heightFolded = de.scrollHeight;
  details.forEach(d => d.open = true);
  const overflowUnfolded = overflow();
  const firstTable = document.querySelector('table');
  const y = e => e ? e.getBoundingClientRect().top + window.scrollY : null;
  const result = {
    title: document.title,
    toc: !!document.querySelector('nav.toc a'),
    images: imgs.length,
    broken: broken,
    tables: document.querySelectorAll('table').length,
    findings: findings ? findings.querySelectorAll('li').length : 0,
    findingsBeforeFirstTable: (findings && firstTable) ?
      !!(findings.compareDocumentPosition(firstTable) & Node.DOCUMENT_POSITION_FOLLOWING) : null,
    findingsTop: y(findings),
    firstTableTop: y(firstTable),
    overflowFolded: overflowFolded,
    overflowUnfolded: overflowUnfolded,
    missingTargets: Array.from(document.querySelectorAll('a[href^="#"]'))
      .map(a => decodeURIComponent(a.getAttribute('href').slice(1)))
      .filter(id => id && !document.getElementById(id)),
    viewport: [window.innerWidth, window.innerHeight],
    pageHeight: heightFolded,
    pageHeightUnfolded: de.scrollHeight,
  };
  details.forEach((d, k) => d.open = wasOpen[k]);
  return result;
})()
"""


def find_browser() -> str | None:
    """The Chromium executable (``OPSPLIT_CHROMIUM``, else ``chromium`` and its usual
    names on the PATH), or ``None``."""
    env = os.environ.get("OPSPLIT_CHROMIUM")
    if env:
        return env if Path(env).is_file() else None
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        p = shutil.which(name)
        if p:
            return p
    return None


class BrowserError(RuntimeError):
    pass


class _Pipe:
    """A Chromium started with ``--remote-debugging-pipe``: commands go to its fd 3, JSON
    messages (NUL-terminated) come back on its fd 4."""

    def __init__(self, browser: str, profile: str, timeout: float):
        self.timeout = timeout
        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()

        def child():  # in the child, before the other descriptors are closed
            a = fcntl.fcntl(to_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [browser, "--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-extensions", "--disable-dev-shm-usage", "--mute-audio", "--hide-scrollbars",
                f"--user-data-dir={profile}", "--remote-debugging-pipe", f"--window-size={WIDTH},{HEIGHT}",
                "about:blank"]
        if os.name == "posix" and os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, pass_fds=(3, 4), preexec_fn=child)
        os.close(to_r)
        os.close(from_w)
        self._buf = b""
        self._id = 0
        self.events: list = []

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"no answer from the browser within {self.timeout:g} s")
            r, _, _ = select.select([self._from_r], [], [], left)
            if r:
                chunk = os.read(self._from_r, 1 << 20)
                if not chunk:
                    err = self.proc.stderr.read().decode(errors="replace")[-2000:] if self.proc.stderr else ""
                    raise BrowserError(f"the browser closed its pipe (exit {self.proc.poll()}): {err}")
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._id += 1
        m = {"id": self._id, "method": method, "params": params or {}}
        if session:
            m["sessionId"] = session
        os.write(self._to_w, json.dumps(m).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            r = self._read(deadline)
            if r.get("id") == self._id:
                if "error" in r:
                    raise BrowserError(f"{method}: {r['error']}")
                return r.get("result", {})
            self.events.append(r)

    def wait_event(self, method: str, session: str | None = None) -> dict:
        deadline = time.monotonic() + self.timeout
        while True:
            for k, e in enumerate(self.events):
                if e.get("method") == method and (session is None or e.get("sessionId") == session):
                    return self.events.pop(k)
            self.events.append(self._read(deadline))

    def close(self):
        try:
            self.send("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_w, self._from_r):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.stderr:
            self.proc.stderr.close()


def check_page(page, shots: dict | None = None, *, browser: str | None = None, timeout: float = 30.0) -> dict:
    """Load ``page`` (an HTML file) in headless Chromium at 1280 x 800 and measure it (see
    :data:`CHECK_JS`); ``shots`` maps a PNG path to ``None`` (the top of the page) or the id
    of an element to scroll to first.  Raises :class:`BrowserError` without a browser."""
    browser = browser or find_browser()
    if browser is None:
        raise BrowserError("no Chromium found (apt-get install chromium, or set OPSPLIT_CHROMIUM)")
    url = Path(page).resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="opsplit-chromium-") as profile:
        b = _Pipe(browser, profile, timeout)
        try:
            target = b.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            s = b.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            b.send("Page.enable", session=s)
            b.send("Emulation.setDeviceMetricsOverride",
                   {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False}, session=s)
            b.send("Page.navigate", {"url": url}, session=s)
            b.wait_event("Page.loadEventFired", s)
            r = b.send("Runtime.evaluate", {"expression": CHECK_JS, "awaitPromise": True, "returnByValue": True},
                       session=s)
            if "exceptionDetails" in r:
                raise BrowserError(f"the check script failed: {r['exceptionDetails']}")
            result = r["result"]["value"]
            for path, anchor in (shots or {}).items():
                js = ("window.scrollTo(0, 0)" if anchor is None else
                      f"document.getElementById({json.dumps(anchor)}).scrollIntoView()")
                b.send("Runtime.evaluate", {"expression": js}, session=s)
                shot = b.send("Page.captureScreenshot", {"format": "png"}, session=s)
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_bytes(base64.b64decode(shot["data"]))
        finally:
            b.close()
    return result


def problems(result: dict) -> list:
    """What is wrong with a page, from :func:`check_page`'s measurements (empty: nothing)."""
    out = []
    if result["broken"]:
        out.append(f"images that do not load: {result['broken']}")
    if result["images"] == 0:
        out.append("no images")
    if not result["title"]:
        out.append("no title")
    if not result["toc"]:
        out.append("no table of contents")
    if result["findings"] == 0:
        out.append("no findings")
    if result["tables"] and not result["findingsBeforeFirstTable"]:
        out.append("the findings are not above the first table")
    if result["tables"] and result["firstTableTop"] is not None and result["findingsTop"] is not None \
            and result["findingsTop"] >= result["firstTableTop"]:
        out.append(f"the findings (y = {result['findingsTop']:.0f}) are not above the first table "
                   f"(y = {result['firstTableTop']:.0f}) on the screen")
    for k in ("overflowFolded", "overflowUnfolded"):
        if result[k] > 0:
            out.append(f"horizontal overflow of {result[k]} px at {WIDTH} px ({k})")
    if result["missingTargets"]:
        out.append(f"links to missing targets: {result['missingTargets']}")
    return out


def shrink_png(path) -> None:
    """Store a screenshot in a 256-colour palette (a page's colours fit; about half the
    bytes), when that is smaller."""
    import io

    from PIL import Image

    raw = Path(path).read_bytes()
    buf = io.BytesIO()
    Image.open(io.BytesIO(raw)).convert("RGB").quantize(256).save(buf, "PNG", optimize=True)
    if buf.tell() < len(raw):
        Path(path).write_bytes(buf.getvalue())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--page", type=Path, help="check this report.html instead of running a job")
    p.add_argument("--quick", action="store_true", help="run `opsplit --quick` (seconds) instead of `opsplit`")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "figures",
                   help="where the screenshots go (default: docs/figures)")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="opsplit-report-") as tmp:
        page = a.page
        if page is None:
            folder = Path(tmp) / "default"
            env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
            subprocess.run([sys.executable, "-m", "opsplit", *(["--quick"] if a.quick else []), "--out",
                            str(folder), "--no-progress"], check=True, env=env, cwd=tmp)
            page = folder / "report.html"
        shots = {a.out / "report_top.png": None, a.out / "report_training.png": "s-training"}
        result = check_page(page, shots)
    for shot in shots:
        shrink_png(shot)  # committed in docs/figures: keep the repository small
    print(json.dumps(result, indent=1))
    bad = problems(result)
    for x in bad:
        print("problem:", x)
    print("screenshots:", ", ".join(str(s) for s in shots))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
