"use strict";
// The attention viewer. Reads one maps document per method (see
// crates/qkv-cli/src/maps/mod.rs) from #qkv-data; every view is drawn from one matrix:
// the picked method, kind, layer and head (or the mean of the heads), with special
// tokens dropped (and rows of weights renormalised) when the toggle says so. Below the
// stage, bars give each token's credit for the target (the document's `scores`).
(() => {
  const docs = JSON.parse(document.getElementById("qkv-data").textContent);
  const options = JSON.parse(document.getElementById("qkv-options").textContent);
  const $ = (id) => document.getElementById(id);
  const NAMES = {
    encoder: "Encoder self-attention",
    decoder: "Decoder self-attention",
    cross: "Cross-attention",
  };
  const METHODS = {
    weights: "Attention weights",
    "value-norm": "Value norms",
    rollout: "Attention rollout",
    flow: "Attention flow",
    grad: "Gradient × attention",
    ablation: "Ablation",
  };
  const ABOUT = {
    weights: "Each head's softmax weights: where a query looks, in one layer.",
    "value-norm": "Each weight times the size of what its key adds through the head (Kobayashi et al. 2020).",
    rollout: "How much each input token reaches a token after this layer, through every layer below and the residual (Abnar & Zuidema 2020).",
    flow: "The maximum flow from a token after this layer down to each input token (Abnar & Zuidema 2020); rows sum to 1.",
    grad: "Heads weighed by the target's gradient, accumulated through the layers (Chefer, Gur & Wolf 2021).",
    ablation: "The target minus the target with one token hidden from every attention: what the model actually uses.",
  };
  // methods whose rows are distributions (they sum to 1), drawn on a fixed 0..1 scale
  const PROBABILITIES = new Set(["weights", "rollout", "flow"]);
  const MEAN = -1;
  const SVG = "http://www.w3.org/2000/svg";

  // Each document's maps by kind, in layer order; each head's [T, S] as one flat array.
  // Combined maps (rollout, flow, grad) become one head.
  for (const d of docs) {
    d.kinds = [];
    d.byKind = {};
    for (const m of d.layers || []) {
      if (!m.heads) {
        m.heads = ["combined"];
        m.weights = [m.weights];
      }
      if (!d.byKind[m.kind]) {
        d.byKind[m.kind] = [];
        d.kinds.push(m.kind);
      }
      m.T = m.weights[0].length;
      m.S = m.T ? m.weights[0][0].length : 0;
      m.flat = m.weights.map((rows) => {
        const a = new Float64Array(m.T * m.S);
        rows.forEach((row, i) => a.set(row, i * m.S));
        return a;
      });
      d.byKind[m.kind].push(m);
    }
  }

  let doc = docs[0];
  const state = { method: 0, kind: doc.kinds[0], layer: 0, head: 0, view: "model", hide: !!options.hide_special };
  const probabilities = () => PROBABILITIES.has(doc.method);

  function sequence(name) {
    return { labels: doc[name], details: doc[name.replace("tokens", "token_details")] };
  }

  function shade(v) {
    const t = Math.min(1, Math.max(0, v));
    const lerp = (a, b) => Math.round(a + (b - a) * t);
    return `rgb(${lerp(255, 8)},${lerp(255, 48)},${lerp(255, 107)})`;
  }

  // The [rows × cols] weights of head h (or MEAN) of map m, over the shown tokens, and
  // the value drawn darkest (1 for distributions, else the largest).
  const cache = new Map();
  function matrix(m, h) {
    const key = `${state.method}/${m.kind}/${m.layer}/${h}/${state.hide}`;
    if (cache.has(key)) return cache.get(key);
    const q = sequence(m.queries);
    const k = sequence(m.keys);
    const keep = (s) => s.labels.map((_, i) => i).filter((i) => !(state.hide && s.details[i].special));
    const rows = keep(q);
    const cols = keep(k);
    let src = m.flat[h === MEAN ? 0 : h];
    if (h === MEAN) {
      src = new Float64Array(m.T * m.S);
      for (const head of m.flat) head.forEach((v, i) => (src[i] += v / m.flat.length));
    }
    const w = new Float64Array(rows.length * cols.length);
    rows.forEach((r, i) => {
      let sum = 0;
      cols.forEach((c, j) => (sum += w[i * cols.length + j] = src[r * m.S + c]));
      if (state.hide && sum > 0 && probabilities()) for (let j = 0; j < cols.length; j++) w[i * cols.length + j] /= sum;
    });
    // gradient × attention starts from the identity: its diagonal is drawn saturated
    // and the scale set by what attention added off it
    const offDiagonal = (i, j) => doc.method !== "grad" || rows[i] !== cols[j];
    let top = probabilities() ? 1 : 1e-12;
    if (!probabilities()) w.forEach((v, at) => offDiagonal(Math.floor(at / cols.length), at % cols.length) && (top = Math.max(top, v)));
    const out = { rows, cols, w, q, k, top };
    cache.set(key, out);
    return out;
  }

  // Mean over query rows of the entropy (bits) of each row's weights.
  function entropy(mat) {
    const n = mat.cols.length;
    let total = 0;
    for (let i = 0; i < mat.rows.length; i++) {
      let e = 0;
      for (let j = 0; j < n; j++) {
        const p = mat.w[i * n + j];
        if (p > 0) e -= p * Math.log2(p);
      }
      total += e;
    }
    return mat.rows.length ? total / mat.rows.length : 0;
  }

  const maps = () => doc.byKind[state.kind];
  const current = () => maps()[state.layer];
  const headName = (m, h) =>
    m.heads[0] === "combined" ? "heads combined" : h === MEAN || m.heads[h] === "mean" ? "mean of heads" : `head ${m.heads[h]}`;

  function option(select, value, text) {
    const o = document.createElement("option");
    o.value = String(value);
    o.textContent = text;
    select.append(o);
  }

  function fillControls() {
    const method = $("method");
    if (!method.options.length) docs.forEach((d, i) => option(method, i, METHODS[d.method] || d.method));
    method.value = String(state.method);
    $("method-about").textContent = ABOUT[doc.method] || "";
    if (!doc.kinds.length) return;
    const kind = $("kind");
    const layer = $("layer");
    const head = $("head");
    kind.replaceChildren();
    doc.kinds.forEach((k) => option(kind, k, NAMES[k]));
    kind.value = state.kind;
    layer.replaceChildren();
    maps().forEach((m, i) => option(layer, i, `layer ${m.layer}`));
    state.layer = Math.min(state.layer, maps().length - 1);
    layer.value = String(state.layer);
    head.replaceChildren();
    const m = current();
    m.heads.forEach((name, i) => option(head, i, headName(m, i)));
    if (m.heads.length > 1) option(head, MEAN, "mean of heads");
    if (state.head !== MEAN) state.head = Math.min(state.head, m.heads.length - 1);
    if (state.head === MEAN && m.heads.length === 1) state.head = 0;
    head.value = String(state.head);
    $("hide-special").checked = state.hide;
  }

  // A heatmap at one canvas pixel per cell, scaled up by CSS (thumbnails).
  function thumbnail(canvas, mat) {
    const n = mat.cols.length;
    const scale = 1 / mat.top;
    canvas.width = Math.max(1, n);
    canvas.height = Math.max(1, mat.rows.length);
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(canvas.width, canvas.height);
    for (let i = 0; i < mat.rows.length; i++) {
      for (let j = 0; j < n; j++) {
        const t = Math.min(1, Math.max(0, mat.w[i * n + j] * scale));
        const at = (i * n + j) * 4;
        img.data[at] = 255 + (8 - 255) * t;
        img.data[at + 1] = 255 + (48 - 255) * t;
        img.data[at + 2] = 255 + (107 - 255) * t;
        img.data[at + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
  }

  // A table whose first row names the current kind's heads, `name` spelling each.
  function headsTable(name) {
    const table = document.createElement("table");
    const top = table.insertRow();
    top.append(document.createElement("th"));
    maps()[0].heads.forEach((h) => {
      const th = document.createElement("th");
      th.textContent = h === "mean" || h === "combined" ? h : name(h);
      top.append(th);
    });
    return table;
  }

  function drawModel() {
    const table = headsTable((h) => `head ${h}`);
    maps().forEach((m, l) => {
      const row = table.insertRow();
      const th = document.createElement("th");
      th.textContent = `layer ${m.layer}`;
      row.append(th);
      m.heads.forEach((_, h) => {
        const cell = row.insertCell();
        const canvas = document.createElement("canvas");
        canvas.className = "thumb";
        canvas.dataset.layer = String(l);
        canvas.dataset.head = String(h);
        const mat = matrix(m, h);
        thumbnail(canvas, mat);
        const aspect = mat.rows.length / Math.max(1, mat.cols.length);
        canvas.style.width = "72px";
        canvas.style.height = `${Math.round(72 * aspect)}px`;
        canvas.title = `layer ${m.layer}, ${headName(m, h)}: entropy ${entropy(mat).toFixed(2)} bits`;
        if (l === state.layer && h === state.head) canvas.classList.add("current");
        canvas.addEventListener("click", () => {
          Object.assign(state, { layer: l, head: h, view: "head" });
          render();
        });
        cell.append(canvas);
      });
    });
    $("model-view").replaceChildren(table);
    $("hint").textContent = "Click a thumbnail to open that head.";
  }

  function drawHead() {
    const m = current();
    const mat = matrix(m, state.head);
    const gap = 22;
    const xq = 170;
    const xk = 430;
    const height = Math.max(mat.rows.length, mat.cols.length) * gap + 20;
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("width", "640");
    svg.setAttribute("height", String(height));
    const yq = (i) => 20 + i * gap + (gap * (Math.max(mat.rows.length, mat.cols.length) - mat.rows.length)) / 2;
    const yk = (j) => 20 + j * gap + (gap * (Math.max(mat.rows.length, mat.cols.length) - mat.cols.length)) / 2;
    const n = mat.cols.length;
    const lines = document.createElementNS(SVG, "g");
    // every line is drawn once; hovering only changes which are visible
    const all = [];
    for (let i = 0; i < mat.rows.length; i++) {
      for (let j = 0; j < n; j++) {
        const w = mat.w[i * n + j] / mat.top;
        if (w < 0.005) continue;
        const line = document.createElementNS(SVG, "line");
        line.setAttribute("x1", String(xq + 6));
        line.setAttribute("y1", String(yq(i)));
        line.setAttribute("x2", String(xk - 6));
        line.setAttribute("y2", String(yk(j)));
        line.setAttribute("stroke-width", String(0.5 + 3 * w));
        lines.append(line);
        all.push({ line, i, j, w });
      }
    }
    svg.append(lines);
    const token = (cls, x, y, idx, seq, at) => {
      const t = document.createElementNS(SVG, "text");
      t.setAttribute("class", cls + (seq.details[idx].special ? " special" : ""));
      t.setAttribute("x", String(x));
      t.setAttribute("y", String(y));
      t.dataset.index = String(at);
      t.textContent = seq.labels[idx];
      svg.append(t);
      return t;
    };
    const qs = mat.rows.map((r, i) => token("q-token", xq, yq(i), r, mat.q, i));
    const ks = mat.cols.map((c, j) => token("k-token", xk, yk(j), c, mat.k, j));
    const weights = [];
    // opacity relative to the heaviest line shown, so that a diffuse head stays visible
    const show = (keep, marks, values, x, y) => {
      const top = Math.max(1e-9, ...all.filter(keep).map((a) => a.w));
      all.forEach((a) => {
        a.line.style.display = keep(a) ? "" : "none";
        a.line.setAttribute("stroke-opacity", String(Math.min(1, a.w / top)));
      });
      weights.forEach((w) => w.remove());
      weights.length = 0;
      qs.concat(ks).forEach((t) => {
        t.classList.remove("active");
        delete t.dataset.weight;
      });
      marks.forEach((t, idx) => {
        if (values === null) return;
        t.dataset.weight = String(values[idx]);
        const w = document.createElementNS(SVG, "text");
        w.setAttribute("class", "weight");
        w.setAttribute("x", String(x));
        w.setAttribute("y", String(y(idx)));
        w.textContent = values[idx].toFixed(3);
        svg.append(w);
        weights.push(w);
      });
    };
    const reset = () => show(() => true, [], null);
    reset();
    qs.forEach((t, i) => {
      t.addEventListener("mouseenter", () => {
        const row = Array.from(mat.w.subarray(i * n, (i + 1) * n));
        show((a) => a.i === i, ks, row, xk + 150, yk);
        t.classList.add("active");
      });
      t.addEventListener("mouseleave", reset);
    });
    ks.forEach((t, j) => {
      t.addEventListener("mouseenter", () => {
        const col = mat.rows.map((_, i) => mat.w[i * n + j]);
        show((a) => a.j === j, qs, col, 8, yq);
        t.classList.add("active");
      });
      t.addEventListener("mouseleave", reset);
    });
    $("head-view").replaceChildren(svg);
    $("hint").textContent =
      "Queries on the left attend to keys on the right. Hover a query for its row, a key for who attends to it.";
  }

  function drawMatrix() {
    const m = current();
    const mat = matrix(m, state.head);
    const canvas = $("matrix");
    const ctx = canvas.getContext("2d");
    const n = mat.cols.length;
    const cell = Math.max(4, Math.min(28, Math.floor(640 / Math.max(n, mat.rows.length, 1))));
    const font = `${Math.max(8, Math.min(13, cell - 4))}px sans-serif`;
    ctx.font = font;
    const width = (labels) => Math.max(20, ...labels.map((s) => ctx.measureText(s).width)) + 8;
    const rowLabels = mat.rows.map((r) => mat.q.labels[r]);
    const colLabels = mat.cols.map((c) => mat.k.labels[c]);
    const left = width(rowLabels);
    const top = width(colLabels);
    canvas.width = left + n * cell + 10;
    canvas.height = top + mat.rows.length * cell + 10;
    Object.assign(canvas.dataset, { left: String(left), top: String(top), cell: String(cell) });
    ctx.font = font;
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    for (let i = 0; i < mat.rows.length; i++) {
      for (let j = 0; j < n; j++) {
        ctx.fillStyle = shade(mat.w[i * n + j] / mat.top);
        ctx.fillRect(left + j * cell, top + i * cell, cell, cell);
      }
    }
    ctx.fillStyle = "#1b1f24";
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    rowLabels.forEach((s, i) => ctx.fillText(s, left - 4, top + (i + 0.5) * cell));
    colLabels.forEach((s, j) => {
      ctx.save();
      ctx.translate(left + (j + 0.5) * cell, top - 4);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(s, 0, 0);
      ctx.restore();
    });
    const tip = $("tooltip");
    canvas.onmousemove = (e) => {
      const box = canvas.getBoundingClientRect();
      const j = Math.floor((e.clientX - box.left - left) / cell);
      const i = Math.floor((e.clientY - box.top - top) / cell);
      if (i < 0 || j < 0 || i >= mat.rows.length || j >= n) {
        tip.hidden = true;
        return;
      }
      tip.textContent = `${rowLabels[i]} → ${colLabels[j]}: ${mat.w[i * n + j].toPrecision(6)}`;
      tip.dataset.row = String(i);
      tip.dataset.col = String(j);
      tip.style.left = `${e.clientX - box.left + 12}px`;
      tip.style.top = `${e.clientY - box.top + 12}px`;
      tip.hidden = false;
    };
    canvas.onmouseleave = () => (tip.hidden = true);
    $("hint").textContent = "Rows are queries, columns keys; hover a cell for its exact weight.";
  }

  function drawEntropy() {
    $("entropy-title").hidden = !probabilities();
    if (!probabilities()) {
      $("entropy").replaceChildren();
      return;
    }
    const table = headsTable((h) => h);
    const values = maps().map((m) => m.heads.map((_, h) => entropy(matrix(m, h))));
    const most = Math.max(1e-9, ...values.flat());
    maps().forEach((m, l) => {
      const row = table.insertRow();
      const th = document.createElement("th");
      th.textContent = `L${m.layer}`;
      row.append(th);
      values[l].forEach((e, h) => {
        const td = row.insertCell();
        td.textContent = e.toFixed(1);
        td.title = `layer ${m.layer}, ${headName(m, h)}: ${e.toFixed(3)} bits`;
        td.style.background = shade(1 - e / most);
        if (1 - e / most > 0.55) td.style.color = "#fff";
        if (l === state.layer && h === state.head) td.classList.add("current");
        td.addEventListener("click", () => {
          Object.assign(state, { layer: l, head: h });
          render();
        });
      });
    });
    $("entropy").replaceChildren(table);
  }

  function drawTop() {
    const mat = matrix(current(), state.head);
    const n = mat.cols.length;
    const list = $("top");
    list.replaceChildren();
    // gradient × attention's R starts from the identity: its row's own diagonal is
    // not what attention credited
    const skip = (i, j) => doc.method === "grad" && current().kind !== "cross" && mat.rows[i] === mat.cols[j];
    mat.rows.forEach((r, i) => {
      let best = -1;
      for (let j = 0; j < n; j++) if (!skip(i, j) && (best < 0 || mat.w[i * n + j] > mat.w[i * n + best])) best = j;
      best = Math.max(best, 0);
      const li = document.createElement("li");
      const w = document.createElement("span");
      w.className = "w";
      w.textContent = ` (${n ? mat.w[i * n + best].toFixed(3) : "–"})`;
      li.textContent = `${mat.q.labels[r]} → ${n ? mat.k.labels[mat.cols[best]] : "–"}`;
      li.append(w);
      list.append(li);
    });
  }

  // Each input token's credit for the target, as a bar from zero (negative to the left).
  function drawScores() {
    const panel = $("scores-panel");
    panel.hidden = !doc.scores;
    if (!doc.scores) {
      $("scores").replaceChildren();
      return;
    }
    const target = doc.target;
    const what = doc.method === "ablation" ? "target − target without the token" : "the target's row of the last map";
    $("scores-title").textContent = target
      ? `Credit for ${target.description} = ${target.value.toFixed(4)} (${what})`
      : `Credit per token (${what})`;
    const top = Math.max(1e-12, ...doc.scores.map(Math.abs));
    const rows = doc.scores.map((v, i) => {
      const details = doc.token_details[i];
      const row = document.createElement("div");
      row.className = "score" + (details.special ? " special" : "");
      row.dataset.index = String(i);
      row.dataset.score = String(v);
      const label = document.createElement("span");
      label.className = "label";
      label.textContent = doc.tokens[i];
      const track = document.createElement("span");
      track.className = "track";
      const bar = document.createElement("span");
      bar.className = v < 0 ? "bar neg" : "bar";
      bar.style.width = `${(50 * Math.abs(v)) / top}%`;
      track.append(bar);
      const value = document.createElement("span");
      value.className = "value";
      value.textContent = v !== 0 && Math.abs(v) < 0.01 ? v.toExponential(2) : v.toFixed(4);
      row.append(label, track, value);
      return row;
    });
    $("scores").replaceChildren(...rows);
  }

  function render() {
    fillControls();
    drawScores();
    document.body.classList.toggle("scores-only", !doc.kinds.length);
    if (!doc.kinds.length) {
      $("current").textContent = METHODS[doc.method];
      $("hint").textContent = "";
      return;
    }
    const m = current();
    $("current").textContent = `${METHODS[doc.method]} · ${NAMES[state.kind]} · layer ${m.layer} · ${headName(m, state.head)}`;
    document.querySelectorAll(".views button").forEach((b) => b.classList.toggle("on", b.dataset.view === state.view));
    document.querySelectorAll(".view").forEach((v) => v.classList.toggle("on", v.id === `${state.view}-view`));
    ({ model: drawModel, head: drawHead, matrix: drawMatrix })[state.view]();
    drawEntropy();
    drawTop();
  }

  $("model").textContent = doc.model;
  $("input-text").textContent = options.text ? `Text: ${options.text}` : "";
  $("skipped").textContent = (options.skipped || []).length
    ? "Not computed: " + options.skipped.map((x) => `${METHODS[x.method] || x.method} (${x.reason})`).join("; ")
    : "";
  $("method").addEventListener("change", (e) => {
    state.method = Number(e.target.value);
    doc = docs[state.method];
    if (doc.kinds.length && !doc.kinds.includes(state.kind)) state.kind = doc.kinds[0];
    render();
  });
  $("about").textContent = `${doc.architecture} (${doc.family}) · ${doc.tokens.length} tokens` +
    (doc.target_tokens ? ` → ${doc.target_tokens.length} target tokens` : "");
  $("kind").addEventListener("change", (e) => {
    Object.assign(state, { kind: e.target.value, layer: 0 });
    render();
  });
  $("layer").addEventListener("change", (e) => {
    state.layer = Number(e.target.value);
    render();
  });
  $("head").addEventListener("change", (e) => {
    state.head = Number(e.target.value);
    render();
  });
  $("hide-special").addEventListener("change", (e) => {
    state.hide = e.target.checked;
    render();
  });
  document.querySelectorAll(".views button").forEach((b) =>
    b.addEventListener("click", () => {
      state.view = b.dataset.view;
      render();
    }),
  );
  render();
})();
