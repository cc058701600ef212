"""Render a report.html in headless Chromium and save a PNG (a script, not a test).

    python scripts/screenshot_report.py reports/report.html docs/report-cpu.png

Needs Debian's chromium (`apt-get install chromium`). The flags keep Chromium off
the network (this machine has none) and out of the GPU.
"""
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    page, png = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        print("no chromium on PATH: apt-get install chromium", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={profile}", "--window-size=1280,2200", "--hide-scrollbars",
                        f"--screenshot={png}", page.as_uri()], check=True, capture_output=True, timeout=120)
    print(f"wrote {png} ({png.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
