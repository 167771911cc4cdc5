"""Drives the attention viewer (`qkv attention --out FILE.html`) in headless Chromium (the
system's, through Playwright) as a user would, and checks what they would see:

- the page loads from file:// with no console error, no page error and no request;
- the model view shows one thumbnail per layer × head of the first kind;
- a click on a thumbnail opens that head; hovering a query token in the head view
  highlights its row: the key tokens' weights
  sum to 1, and equal the weights in the page's own data;
- hovering a cell of the matrix view shows that cell's exact weight;
- picking another head, and another kind when the model has several, redraws the page
  for it; the special-token toggle renormalises rows (they still sum to 1);
- the method picker lists every method the page holds; picking one draws its maps (one
  thumbnail per layer for a method that combines the heads) and its bars, one per token
  with the document's score.

    python check_viewer.py PAGE.html SHOTS_DIR [--chromium /usr/bin/chromium]
                           [--open LAYER,HEAD] [--query N|LABEL]

Saves model.png, head.png, matrix.png (and kind.png, method-NAME.png) in SHOTS_DIR. Prints one JSON object
(what was measured and the problems found) and exits 1 when a check fails.
"""

import argparse
import json
import math
import pathlib
import sys

from playwright.sync_api import sync_playwright


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("page")
    ap.add_argument("shots")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--open", default=None, help="LAYER,HEAD: the thumbnail to click, by position (default: the last)")
    ap.add_argument("--query", default=None, help="query token to hover: its position or its label (default: the middle one)")
    args = ap.parse_args()
    shots = pathlib.Path(args.shots)
    shots.mkdir(parents=True, exist_ok=True)
    url = pathlib.Path(args.page).resolve().as_uri()
    console, errors, requests, problems = [], [], [], []
    found = {}

    def check(ok, what):
        if not ok:
            problems.append(what)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("console", lambda m: console.append({"type": m.type, "text": m.text}))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        page.goto(url, wait_until="load")
        docs = json.loads(page.locator("#qkv-data").text_content())
        doc = docs[0]
        kinds = list(dict.fromkeys(m["kind"] for m in doc["layers"]))
        first = [m for m in doc["layers"] if m["kind"] == kinds[0]]

        # model view: layers × heads thumbnails
        thumbs = page.locator("canvas.thumb").count()
        found["thumbnails"] = thumbs
        found["layers_x_heads"] = [len(first), len(first[0]["heads"])]
        check(thumbs == len(first) * len(first[0]["heads"]), f"{thumbs} thumbnails for {found['layers_x_heads']}")
        page.screenshot(path=str(shots / "model.png"), full_page=True)

        # a click on a thumbnail opens that head
        layer, head = (int(x) for x in args.open.split(",")) if args.open else (len(first) - 1, len(first[-1]["heads"]) - 1)
        page.locator(f"canvas.thumb[data-layer='{layer}'][data-head='{head}']").click()
        current = page.locator("#current").text_content()
        found["after_click"] = current
        check(page.locator("#head-view.on").count() == 1, "a thumbnail click did not open the head view")
        last = first[layer]
        check(f"layer {last['layer']} · head {last['heads'][head]}" in current, f"clicked {layer},{head}, page shows {current!r}")

        # head view: hover a query, its row's weights sum to 1 and match the data
        queries = page.locator("#head-view text.q-token")
        n = queries.count()
        labels = [queries.nth(i).text_content() for i in range(n)]
        q = n // 2 if args.query is None else int(args.query) if args.query.isdigit() else labels.index(args.query)
        queries.nth(q).hover()
        weights = page.eval_on_selector_all(
            "#head-view text.k-token", "ts => ts.map(t => t.dataset.weight === undefined ? null : Number(t.dataset.weight))"
        )
        check(all(w is not None for w in weights), "hovering a query left key tokens without a weight")
        total = sum(w for w in weights if w is not None)
        found["hovered_query"] = {"index": q, "label": queries.nth(q).text_content(), "row_sum": total}
        check(abs(total - 1) < 1e-5, f"hovered row sums to {total}")
        want = last["weights"][head][q]
        check(len(want) == len(weights) and all(abs(a - b) < 1e-6 for a, b in zip(weights, want)),
              "hovered row differs from the page's data")
        visible = page.eval_on_selector_all("#head-view line", "ls => ls.filter(l => l.style.display !== 'none').length")
        found["lines_of_hovered_row"] = visible
        check(0 < visible <= len(weights), f"{visible} lines visible for one query")
        found["heaviest_key"] = doc["tokens"][max(range(len(want)), key=want.__getitem__)] if last["keys"] == "tokens" else None
        page.screenshot(path=str(shots / "head.png"), full_page=True)
        page.mouse.move(5, 5)

        # switch head: the page names the new head
        heads = page.locator("#head option")
        check(heads.count() >= 1, "no head options")
        page.select_option("#head", index=heads.count() - 1 if head == 0 else 0)
        found["after_head_switch"] = page.locator("#current").text_content()
        check(found["after_head_switch"] != current, "switching head did not change the page")

        # special tokens hidden: rows still sum to 1
        page.check("#hide-special")
        page.locator("#head-view text.q-token").nth(0).hover()
        hidden = page.eval_on_selector_all("#head-view text.k-token", "ts => ts.map(t => Number(t.dataset.weight))")
        found["row_sum_special_hidden"] = sum(hidden)
        check(abs(sum(hidden) - 1) < 1e-5, f"with special tokens hidden the row sums to {sum(hidden)}")
        page.uncheck("#hide-special")

        # matrix view: the tooltip of a cell shows its weight
        page.click("button[data-view=matrix]")
        canvas = page.locator("#matrix")
        box = canvas.bounding_box()
        ds = canvas.evaluate("c => ({left: +c.dataset.left, top: +c.dataset.top, cell: +c.dataset.cell})")
        scale = box["width"] / canvas.evaluate("c => c.width")
        page.mouse.move(box["x"] + (ds["left"] + 1.5 * ds["cell"]) * scale, box["y"] + (ds["top"] + 0.5 * ds["cell"]) * scale)
        tip = page.locator("#tooltip")
        text = tip.text_content() if tip.is_visible() else ""
        found["tooltip"] = text
        shown_head = int(page.locator("#head").input_value())
        h_weights = last["weights"][shown_head] if shown_head >= 0 else None
        cell = h_weights[0][1] if h_weights else sum(w[0][1] for w in last["weights"]) / len(last["weights"])
        check(text.endswith(f"{cell:.6g}") or (text and math.isclose(float(text.rsplit(':', 1)[1]), cell, rel_tol=1e-5)),
              f"tooltip {text!r}, weight {cell}")
        page.screenshot(path=str(shots / "matrix.png"), full_page=True)

        # another kind, where the model has one
        if len(kinds) > 1:
            page.select_option("#kind", kinds[-1])
            page.click("button[data-view=model]")
            other = [m for m in doc["layers"] if m["kind"] == kinds[-1]]
            thumbs = page.locator("canvas.thumb").count()
            found["kind_switch"] = {"kind": kinds[-1], "thumbnails": thumbs, "current": page.locator("#current").text_content()}
            check(thumbs == len(other) * len(other[0]["heads"]), f"{thumbs} thumbnails after switching to {kinds[-1]}")
            page.click("button[data-view=head]")
            page.screenshot(path=str(shots / "kind.png"), full_page=True)
        # every method: its maps and its bars
        found["methods"] = {}
        for i, d in enumerate(docs):
            page.select_option("#method", str(i))
            page.click("button[data-view=model]") if d.get("layers") else None
            seen = {"thumbnails": page.locator("canvas.thumb").count() if d.get("layers") else 0}
            if d.get("layers"):
                mine = [m for m in d["layers"] if m["kind"] == d["layers"][0]["kind"]]
                heads = len(mine[0]["heads"]) if "heads" in mine[0] else 1
                check(seen["thumbnails"] == len(mine) * heads,
                      f"{d['method']}: {seen['thumbnails']} thumbnails for {len(mine)} layers × {heads}")
            bars = page.eval_on_selector_all("#scores .score", "rs => rs.map(r => Number(r.dataset.score))")
            seen["bars"] = len(bars)
            if d.get("scores") is not None:
                check(len(bars) == len(d["scores"]) and all(abs(a - b) < 1e-6 for a, b in zip(bars, d["scores"])),
                      f"{d['method']}: the bars differ from the scores")
                seen["top_bar"] = d["tokens"][max(range(len(bars)), key=bars.__getitem__)]
            else:
                check(not page.locator("#scores-panel").is_visible(), f"{d['method']}: bars without scores")
            found["methods"][d["method"]] = seen
            page.screenshot(path=str(shots / f"method-{d['method']}.png"), full_page=True)
        browser.close()
    problems += [f"console {m['type']}: {m['text']}" for m in console if m["type"] in ("error", "warning")]
    problems += [f"page error: {e}" for e in errors]
    problems += [f"network request: {u}" for u in requests if u != url]
    print(json.dumps({"url": url, "kinds": kinds, "found": found, "console": console, "problems": problems},
                     indent=1, ensure_ascii=False))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
