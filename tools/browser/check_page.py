"""Loads a local HTML page in headless Chromium (the system's, through Playwright) and
checks it the way a reader would see it: every <svg> figure has a non-zero size, the
console logs no error, the page raises nothing, and it asks for nothing over the
network. Takes a full-page screenshot.

    python check_page.py PAGE.html SHOT.png [--chromium /usr/bin/chromium]

Prints one JSON object (figures and their sizes, console messages, requests) and exits
1 when a check fails.
"""

import argparse
import json
import pathlib
import sys

from playwright.sync_api import sync_playwright


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("page")
    ap.add_argument("shot")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args()
    url = pathlib.Path(args.page).resolve().as_uri()
    console, errors, requests = [], [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=args.chromium, args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: console.append({"type": m.type, "text": m.text}))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        page.goto(url, wait_until="load")
        figures = page.evaluate(
            """() => [...document.querySelectorAll('figure svg')].map(s => {
                const r = s.getBoundingClientRect();
                return {section: s.closest('section')?.id ?? null,
                        width: r.width, height: r.height};
            })"""
        )
        page.screenshot(path=args.shot, full_page=True)
        browser.close()
    problems = []
    if not figures:
        problems.append("the page has no figures")
    problems += [f"figure {f} has no area" for f in figures if f["width"] <= 0 or f["height"] <= 0]
    problems += [f"console {m['type']}: {m['text']}" for m in console if m["type"] in ("error", "warning")]
    problems += [f"page error: {e}" for e in errors]
    problems += [f"network request: {u}" for u in requests if u != url]
    print(json.dumps({"url": url, "figures": figures, "console": console,
                      "requests": requests, "problems": problems}, indent=1))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
