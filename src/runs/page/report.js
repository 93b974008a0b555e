"use strict";
window.addEventListener("error", e => {
  document.getElementById("errors").textContent += "script error: " + e.message + "\n";
  document.body.dataset.rendered = "error";
});
const runs = JSON.parse(document.getElementById("data").textContent);
const app = document.getElementById("app");
const NS = "http://www.w3.org/2000/svg";
const COLORS = {weights:"#4e79a7",gradients:"#f28e2b",optimizer_state:"#59a14f",other:"#bab0ac",
  param:"#4e79a7",buffer:"#76b7b2",grad:"#f28e2b",act:"#e15759",temp:"#edc948",opt:"#59a14f"};
const RUN_COLORS = ["#4e79a7","#e15759","#59a14f","#f28e2b","#b07aa1","#76b7b2","#edc948","#9c755f","#ff9da7","#555555"];
// Charts of at most this many reported iterations (or epochs) are drawn as bars with their values.
const FEW = 12;
// Curves drawn at first on a page of many runs (the largest peaks); the others on demand.
const SHOWN_CURVES = 6;
// Above this many runs, each run's own section opens on demand.
const OPEN_SECTIONS = 4;
// Hatch patterns made so far (each chart's band has its own id).
let hatches = 0;
// Where section(), table() and the charts put what they make.
let out = app;
function into(parent, f) { const prev = out; out = parent; try { f(); } finally { out = prev; } }
function el(tag, text, cls) { const e = document.createElement(tag); if (text !== undefined) e.textContent = text; if (cls) e.className = cls; return e; }
// A text cell whose long names wrap after "::" and "/" (an op's or a path's parts) rather
// than push the table past the page: a <wbr> there, text nodes around it (the same text
// read or copied).
function breakable(td, text) { text.split(/(?<=::|\/)/).forEach((part, i) => { if (i) td.appendChild(document.createElement("wbr")); td.appendChild(document.createTextNode(part)); }); return td; }
function svgEl(tag, attrs) { const e = document.createElementNS(NS, tag); for (const k in attrs) e.setAttribute(k, attrs[k]); return e; }
function svgText(attrs, text) { const t = svgEl("text", attrs); t.textContent = text; return t; }
function tip(node, text) { const t = svgEl("title", {}); t.textContent = text; node.appendChild(t); return node; }
function bytes(n) { if (n === null || n === undefined) return "-"; const u = ["B","KiB","MiB","GiB","TiB"]; let v = n, i = 0; while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; } return i ? v.toFixed(2) + " " + u[i] : n + " B"; }
function exact(n) { return n.toLocaleString("en-US") + " B"; }
function section(title) { out.appendChild(el("h2", title)); }
function runColor(i) { return RUN_COLORS[i % RUN_COLORS.length]; }
function runDash(i) { return ["", "6 3", "2 2", "8 3 2 3"][Math.floor(i / RUN_COLORS.length) % 4]; }
// rows: [{cells, keys}]; opts.sortable: column indices, opts.ids: a name per column (for #sort=NAME).
function table(headers, rows, opts) {
  opts = opts || {};
  const t = el("table"), head = el("tr");
  const ths = headers.map((h, i) => {
    const th = el("th", h, i === 0 || (opts.left || []).includes(i) ? "l" : "");
    if ((opts.sortable || []).includes(i)) { th.classList.add("sort"); th.title = "sort by " + h; th.onclick = () => sortBy(i); }
    if (opts.ids && opts.ids[i]) th.dataset.col = opts.ids[i];
    head.appendChild(th);
    return th;
  });
  t.appendChild(head);
  const body = [];
  function fill(rs) { body.forEach(r => r.remove()); body.length = 0; rs.forEach(r => { const tr = el("tr"); r.cells.forEach((c, i) => tr.appendChild(i === 0 || (opts.left || []).includes(i) ? breakable(el("td", undefined, "l"), String(c)) : el("td", String(c)))); t.appendChild(tr); body.push(tr); }); }
  function cmp(a, b) {
    if (typeof a === "string" || typeof b === "string") return String(a ?? "").localeCompare(String(b ?? ""), "en", {numeric: true});
    return (a ?? -1) - (b ?? -1);
  }
  let dir = -1, last = -1;
  function sortBy(i, d) {
    dir = d || (last === i ? -dir : (rows.length && typeof rows[0].keys[i] === "string" ? 1 : -1)); last = i;
    ths.forEach((th, j) => { th.dataset.sorted = j === i ? (dir < 0 ? "desc" : "asc") : ""; });
    fill(rows.slice().sort((a, b) => dir * cmp(a.keys[i], b.keys[i])));
  }
  fill(rows);
  out.appendChild(t);
  t.sortBy = sortBy;
  return t;
}
function frame(ymax, H, T, B, W, L, R, svg) {
  const Y = y => T + (1 - y / ymax) * (H - T - B);
  for (let k = 0; k <= 4; k++) {
    const y = ymax * k / 4;
    svg.appendChild(svgEl("line", {x1: L, x2: W - R, y1: Y(y), y2: Y(y), stroke: "#eee"}));
    svg.appendChild(svgText({x: L - 4, y: Y(y) + 4, "text-anchor": "end", "font-size": 11}, bytes(Math.round(y))));
  }
  return Y;
}
function legend(items) {
  const lg = el("div", undefined, "legend");
  for (const s of items) { const sp = el("span"); const i = el("i"); i.style.background = s.color; if (s.dash) i.className = "dash"; sp.appendChild(i); sp.appendChild(document.createTextNode(s.name)); lg.appendChild(sp); }
  return lg;
}
// Labels at the right of x, pushed apart so that none covers another, between top and bottom:
// [{y, text, color}].
function sideLabels(svg, x, labels, top, bottom) {
  labels.sort((a, b) => a.y - b.y);
  labels.forEach(l => { l.y += 4; });
  for (let i = 0; i < labels.length; i++) labels[i].y = Math.max(labels[i].y, i ? labels[i - 1].y + 13 : top);
  for (let i = labels.length - 1; i >= 0; i--) labels[i].y = Math.min(labels[i].y, i < labels.length - 1 ? labels[i + 1].y - 13 : bottom);
  for (const l of labels) svg.appendChild(svgText({x, y: l.y, "font-size": 11, fill: l.color, class: "value"}, l.text));
}
function chart(opts) {
  // opts: series [{name, color, values}] stacked as areas; lines [{name, color, values, dash}];
  // xs; markers [{x, y, label}]; vlines [{x, label}]; band {name, values}: bytes of the
  // stack's top drawn hatched (never more than the stack).
  const W = 1000, H = 300, L = 70, R = 10, T = 10, B = 30;
  const svg = svgEl("svg", {viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img"});
  const xs = opts.xs, n = xs.length;
  if (!n) return;
  const stacked = xs.map((_, i) => opts.series.reduce((s, se) => s + se.values[i], 0));
  const ymax = Math.max(1, ...stacked, ...opts.lines.flatMap(l => l.values.filter(v => v !== null)));
  const Y = frame(ymax, H, T, B, W, L, R, svg);
  const x0 = Math.min(...xs), x1 = Math.max(...xs);
  const X = x => x1 === x0 ? (L + W - R) / 2 : L + (x - x0) / (x1 - x0) * (W - L - R);
  const ticks = n <= FEW ? xs : [x0, x1];
  ticks.forEach((x, i) => svg.appendChild(svgText({x: X(x), y: H - 8, "font-size": 11, "text-anchor": i === 0 && n > FEW ? "start" : i === ticks.length - 1 && n > FEW ? "end" : "middle"}, (i === ticks.length - 1 ? opts.xlabel + " " : "") + x)));
  let base = xs.map(() => 0);
  for (const se of opts.series) {
    const top = base.map((b, i) => b + se.values[i]);
    let d = "M" + xs.map((x, i) => X(x) + "," + Y(top[i])).join("L");
    d += "L" + xs.map((x, i) => X(x) + "," + Y(base[i])).reverse().join("L") + "Z";
    svg.appendChild(svgEl("path", {d, fill: se.color, "fill-opacity": 0.85, stroke: "none"}));
    base = top;
  }
  const band = opts.band;
  if (band) {
    // Hatched, between the top of the stack and that top less the band's bytes.
    const id = "hatch" + (++hatches);
    const defs = svgEl("defs", {}), pat = svgEl("pattern", {id, width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)"});
    pat.appendChild(svgEl("rect", {width: 6, height: 6, fill: "#fff", "fill-opacity": 0.55}));
    pat.appendChild(svgEl("line", {x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#222", "stroke-width": 2}));
    defs.appendChild(pat);
    svg.appendChild(defs);
    const low = base.map((b, i) => b - band.values[i]);
    let d = "M" + xs.map((x, i) => X(x) + "," + Y(base[i])).join("L");
    d += "L" + xs.map((x, i) => X(x) + "," + Y(low[i])).reverse().join("L") + "Z";
    svg.appendChild(tip(svgEl("path", {d, fill: `url(#${id})`, stroke: "none", class: "band"}), band.name));
    svg.appendChild(svgEl("path", {d: "M" + xs.map((x, i) => X(x) + "," + Y(low[i])).join("L"), fill: "none", stroke: "#222", "stroke-width": 1}));
    band.color = "repeating-linear-gradient(45deg,#222 0 2px,#fff 2px 5px)";
  }
  for (const l of opts.lines) {
    const pts = xs.map((x, i) => l.values[i] === null ? null : [X(x), Y(l.values[i]), l.values[i], x]).filter(p => p);
    if (pts.length) svg.appendChild(svgEl("path", {d: "M" + pts.map(p => p[0] + "," + p[1]).join("L"), fill: "none", stroke: l.color, "stroke-width": 1.5, "stroke-dasharray": l.dash || ""}));
    // Few points (a run reported every n-th iteration): each one drawn, so none is lost.
    if (pts.length <= 60) for (const p of pts) svg.appendChild(tip(svgEl("circle", {cx: p[0], cy: p[1], r: 2.5, fill: l.color}), l.name + ", " + opts.xlabel + " " + p[3] + ": " + bytes(p[2])));
  }
  for (const v of opts.vlines || []) {
    svg.appendChild(svgEl("line", {x1: X(v.x), x2: X(v.x), y1: T, y2: H - B, stroke: "#333", "stroke-dasharray": "4 3"}));
    svg.appendChild(svgText({x: X(v.x) + 3, y: H - B - 4, "font-size": 11}, v.label));
  }
  for (const m of opts.markers || []) {
    svg.appendChild(svgEl("circle", {cx: X(m.x), cy: Y(m.y), r: 4, fill: "#b00"}));
    // Right of the marker in the chart's left half, left of it in the right half.
    const right = X(m.x) > (L + W - R) / 2;
    svg.appendChild(svgText({x: X(m.x) + (right ? -6 : 6), y: Math.max(Y(m.y) - 6, T + 12), "font-size": 11, fill: "#b00", "text-anchor": right ? "end" : "start"}, m.label));
  }
  const box = el("div", undefined, "chart");
  box.appendChild(svg);
  box.appendChild(legend(opts.series.concat(band ? [band] : [], opts.lines)));
  out.appendChild(box);
  return box;
}
// Bars for few points, each with its value written: groups [{label, segs: [{name, color, value}],
// marks: [{name, color, value, dash}]}]. stacked: the segs of a group make one bar (categories
// of memory); else they stand side by side (figures of an epoch).
function bars(opts) {
  const W = 1000, H = 300, L = 70, R = 10, T = 12, B = 30;
  const svg = svgEl("svg", {viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", class: "bars"});
  const groups = opts.groups, n = groups.length;
  const top = g => opts.stacked ? g.segs.reduce((s, x) => s + x.value, 0) : Math.max(0, ...g.segs.map(x => x.value));
  const ymax = Math.max(1, ...groups.map(top), ...groups.flatMap(g => (g.marks || []).map(m => m.value))) * 1.05;
  const Y = frame(ymax, H, T, B, W, L, R, svg);
  // Room at the right of each bar for its values when there are few groups.
  const slot = (W - L - R) / n, side = opts.stacked && n <= 4 ? Math.min(230, slot * 0.5) : 0;
  const width = opts.stacked ? 120 : 64 * Math.max(...groups.map(g => g.segs.length));
  const bw = Math.min(width, (slot - side) * (opts.stacked ? 0.7 : 0.85));
  groups.forEach((g, gi) => {
    const x0 = L + slot * gi + (slot - side - bw) / 2;
    svg.appendChild(svgText({x: x0 + bw / 2, y: H - 10, "font-size": 11, "text-anchor": "middle"}, g.label));
    const labels = [];
    if (opts.stacked) {
      let base = 0;
      for (const s of g.segs) {
        if (s.value <= 0) continue;
        const y = Y(base + s.value), h = Y(base) - y;
        svg.appendChild(tip(svgEl("rect", {x: x0, y, width: bw, height: Math.max(h, 0.5), fill: s.color, "fill-opacity": 0.85}), s.name + ": " + bytes(s.value)));
        if (side && h >= 3) labels.push({y: y + h / 2, text: s.name + " " + bytes(s.value), color: "#444"});
        base += s.value;
      }
    } else {
      const w = bw / g.segs.length;
      g.segs.forEach((s, si) => {
        const x = x0 + si * w;
        svg.appendChild(tip(svgEl("rect", {x: x + 1, y: Y(s.value), width: Math.max(w - 2, 1), height: Math.max(Y(0) - Y(s.value), 0.5), fill: s.color, "fill-opacity": 0.85}), g.label + ", " + s.name + ": " + bytes(s.value)));
        if (si === 0 || w >= 50) svg.appendChild(svgText({x: x + w / 2, y: Y(s.value) - 3, "font-size": 10, "text-anchor": "middle", class: "value"}, bytes(s.value)));
      });
    }
    (g.marks || []).forEach((m, mi) => {
      svg.appendChild(tip(svgEl("line", {x1: x0 - 6, x2: x0 + bw + 6, y1: Y(m.value), y2: Y(m.value), stroke: m.color, "stroke-width": 2, "stroke-dasharray": m.dash || ""}), m.name + ": " + bytes(m.value)));
      if (side) labels.push({y: Y(m.value), text: m.name + " " + bytes(m.value), color: m.color});
      else if (mi === 0) svg.appendChild(svgText({x: x0 + bw / 2, y: Math.max(Y(m.value) - 4, T + 8), "font-size": 10, "text-anchor": "middle", fill: m.color, class: "value"}, bytes(m.value)));
    });
    if (labels.length) sideLabels(svg, x0 + bw + 10, labels, 11, H - 4);
  });
  const box = el("div", undefined, "chart");
  box.appendChild(svg);
  const seen = new Map();
  for (const g of groups) for (const s of g.segs.concat(g.marks || [])) seen.set(s.name, s);
  box.appendChild(legend([...seen.values()]));
  out.appendChild(box);
  return box;
}
// Horizontal bars, one per run, its value written beside it.
function runBars(title, items) {
  out.appendChild(el("h3", title));
  const rowH = 20, L = 260, R = 110, W = 1000, T = 4, H = T + rowH * items.length + 4;
  const svg = svgEl("svg", {viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", class: "runbars"});
  const vmax = Math.max(1, ...items.map(it => it.value));
  items.forEach((it, i) => {
    const y = T + i * rowH, w = it.value / vmax * (W - L - R);
    const name = it.name.length > 40 ? it.name.slice(0, 39) + "…" : it.name;
    svg.appendChild(tip(svgText({x: L - 6, y: y + 14, "font-size": 12, "text-anchor": "end"}, name), it.name));
    svg.appendChild(tip(svgEl("rect", {x: L, y: y + 3, width: Math.max(w, 1), height: rowH - 6, fill: it.color}), it.name + ": " + exact(it.value)));
    svg.appendChild(svgText({x: L + w + 6, y: y + 14, "font-size": 11, class: "value"}, bytes(it.value)));
  });
  out.appendChild(svg);
}
function overview(r) {
  const p = r.points, cpu = r.devices.includes("cpu");
  table(["", "bytes", "exact", "at step"], [
    {cells: ["peak allocated", bytes(r.peak_allocated), exact(r.peak_allocated), r.peak_allocated_step], keys: []},
    {cells: [cpu ? "peak resident (process)" : "peak reserved", bytes(r.peak_reserved), exact(r.peak_reserved), r.peak_reserved_step], keys: []},
  ]);
  out.appendChild(el("p", `${r.steps} reported iteration${r.steps === 1 ? "" : "s"} on ${r.devices.join(", ")}` + (p.length < r.steps ? `; the curve keeps ${p.length} points (each bucket's lowest and highest)` : "") + "; files " + r.stem, "muted"));
  const cats = [
    {name: "weights", color: COLORS.weights, key: "weights_bytes"},
    {name: "gradients", color: COLORS.gradients, key: "gradients_bytes"},
    {name: "optimizer state", color: COLORS.optimizer_state, key: "optimizer_state_bytes"},
    {name: "other", color: COLORS.other, key: "other_bytes"}];
  const lines = [
    {name: "peak allocated", color: "#b00", key: "peak_allocated_bytes"},
    {name: "feature maps", color: "#e15759", dash: "4 3", key: "feature_maps_bytes"},
    {name: "intermediate gradients", color: "#b07aa1", dash: "2 2", key: "intermediate_gradients_bytes"}]
    .concat(cpu ? [] : [{name: "peak reserved", color: "#555", key: "peak_reserved_bytes"}]);
  if (p.length <= FEW) {
    // A few reported iterations: a bar each, its categories and peaks written out.
    bars({stacked: true, groups: p.map(q => ({label: "step " + q.step,
      segs: cats.map(c => ({name: c.name, color: c.color, value: q[c.key]})),
      marks: lines.map(l => ({name: l.name, color: l.color, dash: l.dash, value: q[l.key]}))}))});
  } else {
    chart({xs: p.map(q => q.step), xlabel: "step",
      series: cats.map(c => ({name: c.name, color: c.color, values: p.map(q => q[c.key])})),
      lines: lines.map(l => ({name: l.name, color: l.color, dash: l.dash, values: p.map(q => q[l.key])})),
      markers: [{x: r.peak_allocated_step, y: r.peak_allocated, label: "peak allocated " + bytes(r.peak_allocated) + " (step " + r.peak_allocated_step + ")"}]});
  }
  if (r.epochs.length > p.length) {
    // More epochs than reported iterations: the epochs tell more.
    out.appendChild(el("h3", "Each epoch's peaks (every iteration measured, reported or not)"));
    const figs = [
      {name: "peak allocated", color: "#b00", key: "peak_allocated_bytes"},
      {name: "peak feature maps", color: "#e15759", key: "peak_feature_maps_bytes"},
      {name: "peak intermediate gradients", color: "#b07aa1", key: "peak_intermediate_gradients_bytes"},
      {name: "allocated at end", color: "#4e79a7", key: "allocated_bytes"}]
      .concat(cpu ? [] : [{name: "peak reserved", color: "#555", key: "peak_reserved_bytes"}]);
    bars({stacked: false, groups: r.epochs.map(e => ({label: "epoch " + e.epoch,
      segs: figs.map(f => ({name: f.name, color: f.color, value: e[f.key]}))}))});
  }
}
// A step's live bytes after each op, stacked by category; with idleMax (the largest of its
// rows' idle bytes) above 0, the bytes idle at the step's peak that no op reads again drawn
// as a hatched band at the top of the stack, whose lower edge is what would have been live
// had they been freed right after their last reads.
function stepChart(t, idleMax) {
  const cats = ["param", "buffer", "grad", "act", "temp", "opt", "other"];
  const names = {param: "parameters", buffer: "buffers", grad: "gradients", act: "activations", temp: "temporaries", opt: "optimizer state", other: "other"};
  const bwd = t.find(q => q.phase === "backward"), opt = t.find(q => q.phase === "optimizer");
  const peak = t.reduce((a, q) => q.total_bytes > a.total_bytes ? q : a, t[0]);
  chart({xs: t.map(q => q.op_index), xlabel: "op", lines: [],
    series: cats.map(c => ({name: names[c], color: COLORS[c], values: t.map(q => q[c + "_bytes"])})),
    band: idleMax > 0 ? {name: "idle at the peak, read by no op again (up to " + bytes(idleMax) + ")", values: t.map(q => q.idle_bytes)} : null,
    vlines: [bwd && {x: bwd.op_index, label: "backward"}, opt && {x: opt.op_index, label: "optimizer"}].filter(v => v),
    markers: [{x: peak.op_index, y: peak.total_bytes, label: "highest at an op's end: " + bytes(peak.total_bytes) + ", " + peak.op + " (" + peak.layer + ")"}]});
}
function details(r) {
  if (r.epochs.length) {
    section("Epochs");
    table(["epoch", "iterations", "peak allocated", "peak reserved / resident", "peak feature maps", "peak intermediate gradients", "allocated at end", "change"],
      r.epochs.map(e => ({cells: [e.epoch, e.iterations, bytes(e.peak_allocated_bytes), bytes(e.peak_reserved_bytes), bytes(e.peak_feature_maps_bytes), bytes(e.peak_intermediate_gradients_bytes), bytes(e.allocated_bytes), (e.allocated_change_bytes < 0 ? "-" : "+") + bytes(Math.abs(e.allocated_change_bytes))], keys: []})));
  }
  if (r.params.length) {
    section("Parameters (last report; click a header to sort)");
    table(["parameter", "kind", "dtype", "shape", "weight", "gradient"],
      r.params.map(q => ({cells: [q.name, q.kind, q.dtype, q.shape, bytes(q.bytes), bytes(q.grad_bytes)], keys: [q.name, q.kind, q.dtype, q.shape, q.bytes, q.grad_bytes]})),
      {sortable: [0, 4, 5], left: [1, 2, 3]});
  }
  if (r.examined.length) {
    section("The profiled step: step " + r.examined_step + ", asked for with timeline_step, op by op" + (r.examined_is_peak ? " (the run's peak step is the same, op for op)" : ""));
    stepChart(r.examined, r.examined_idle_max);
  }
  if (r.timeline.length) {
    section("The profiled step: the run's peak step, op by op");
    stepChart(r.timeline, 0);
  }
  if (r.layers.length) {
    section("Layers of the run's peak step");
    table(["layer", "parameters", "activations", "forward FLOPs", "backward FLOPs"],
      r.layers.map(l => ({cells: [l.layer, bytes(l.parameters_bytes), bytes(l.activation_bytes), l.forward_flops.toLocaleString("en-US"), l.backward_flops.toLocaleString("en-US")], keys: [l.layer, l.parameters_bytes, l.activation_bytes, l.forward_flops, l.backward_flops]})),
      {sortable: [0, 1, 2, 3, 4]});
  }
  if (r.idle.length) {
    section("Idle at the peak of the examined step" + (r.examined_step ? " (step " + r.examined_step + ")" : "") + ": live, but read by no op after it");
    const idle = r.idle.reduce((a, b) => a + b.bytes, 0);
    out.appendChild(el("p", bytes(idle) + " in " + r.idle.length + " blocks; each row's last column is the step's peak had that block been freed right after its last read", "muted"));
    table(["bytes", "made by", "layer", "phase", "last read by", "freed during", "line", "peak if dropped"],
      r.idle.map(b => ({cells: [bytes(b.bytes), b.op, b.layer, b.phase, b.last_read_op, b.freed_at_op, b.site, bytes(b.peak_if_dropped)], keys: [b.bytes, b.op, b.layer, b.phase, b.last_read_op, b.freed_at_op, b.site, b.peak_if_dropped]})),
      {sortable: [0, 1, 6, 7], left: [1, 2, 3, 4, 5, 6]});
  }
  if (r.leaks.length) {
    section("Leak suspects");
    table(["op", "phase", "layer", "epoch", "iterations", "count", "bytes"],
      r.leaks.map(k => ({cells: [k.op, k.phase, k.layer, k.epoch, k.first_iteration + "-" + k.last_iteration, k.count, bytes(k.bytes)], keys: []})), {left: [1, 2]});
  }
  for (const [name, text] of r.ooms) { section("Out of memory: " + name); out.appendChild(el("pre", text)); }
  for (const w of r.warnings) out.appendChild(el("p", "warning: " + w, "muted"));
}
// Settings from <run>_run.csv, by key: what every run shares, and what differs between them.
const SETTINGS = {tch_memprof: "tch-memprof", libtorch: "libtorch", device: "device", print_period: "report period"};
function setting(k, v) { return k === "print_period" ? (v === "1" ? "every iteration reported" : "every " + v + "th iteration reported") : (SETTINGS[k] || k) + " " + v; }
function settings() {
  const keys = [...new Set(runs.flatMap(r => Object.keys(r.meta)))].filter(k => k !== "started" && k !== "label");
  // The known ones in the order of <run>_run.csv, then the others.
  const order = Object.keys(SETTINGS), at = k => order.includes(k) ? order.indexOf(k) : order.length;
  keys.sort((a, b) => at(a) - at(b) || a.localeCompare(b));
  const same = [], differ = [];
  for (const k of keys) {
    const vals = new Set(runs.map(r => r.meta[k] ?? "-"));
    (vals.size > 1 ? differ : same).push(k);
  }
  // A different model shows in its weights.
  const weights = new Set(runs.map(r => r.peaks.weights_bytes)).size > 1;
  return {same, differ, weights};
}
function sideBySide() {
  const s = settings();
  section("Runs side by side");
  const shared = s.same.map(k => setting(k, runs[0].meta[k]));
  out.appendChild(el("p", (shared.length ? "Every run: " + shared.join(", ") + ". " : "") +
    (s.differ.length || s.weights ? "Differ between runs: " + s.differ.map(k => SETTINGS[k] || k).concat(s.weights ? ["weights (the model)"] : []).join(", ") + " (columns below)." : "No recorded setting differs; the labels or folders tell the runs apart."), "muted"));
  const mean = k => runs.reduce((sum, r) => sum + r[k], 0) / runs.length;
  const ma = mean("peak_allocated");
  const pct = (v, m) => m ? ((v - m) / m * 100).toFixed(1) + "%" : "-";
  const peakCols = [["peak_allocated", "peak allocated"], ["peak_reserved", "peak reserved / resident"], ["feature_maps", "feature maps"], ["intermediate_gradients", "intermediate gradients"], ["optimizer_state", "optimizer state"], ["gradients", "gradients"], ["weights", "weights"]];
  const headers = ["run", "iterations", peakCols[0][1], "vs mean"].concat(peakCols.slice(1).map(c => c[1]), s.differ.map(k => SETTINGS[k] || k));
  const ids = ["run", "iterations", "peak_allocated", "vs_mean"].concat(peakCols.slice(1).map(c => c[0]), s.differ);
  const peak = (r, c) => c === "peak_allocated" ? r.peak_allocated : c === "peak_reserved" ? r.peak_reserved : r.peaks[c + "_bytes"];
  const rows = runs.map(r => {
    const ps = peakCols.map(c => peak(r, c[0]));
    const set = s.differ.map(k => r.meta[k] ?? "-");
    return {cells: [r.name, r.steps, bytes(ps[0]), pct(ps[0], ma)].concat(ps.slice(1).map(bytes), set),
      keys: [r.name, r.steps, ps[0], ps[0] - ma].concat(ps.slice(1), set)};
  });
  out.appendChild(el("p", "Click a header to sort; each value is the run's largest over its reported iterations.", "muted"));
  const t = table(headers, rows, {sortable: headers.map((_, i) => i), ids, left: s.differ.map((_, i) => 4 + peakCols.length - 1 + i)});
  t.id = "runs";
  const want = new URLSearchParams(location.hash.slice(1)).get("sort");
  const at = ids.indexOf(want);
  if (at >= 0) t.sortBy(at, -1);
  // The colors of the curves below; one color for a sweep, where they would not tell runs apart.
  runBars("Peak allocated by run", runs.map((r, i) => ({name: r.name, value: r.peak_allocated, color: runs.length <= RUN_COLORS.length ? runColor(i) : "#4e79a7"})));
  curves();
}
// Peak allocated over steps, one curve per run: the largest few, the others on demand.
function curves() {
  const steps = [...new Set(runs.flatMap(r => r.points.map(q => q.step)))].sort((a, b) => a - b);
  if (steps.length < 2) return;
  out.appendChild(el("h3", "Peak allocated over steps"));
  const order = runs.map((r, i) => i).sort((a, b) => runs[b].peak_allocated - runs[a].peak_allocated);
  const shown = new Set(order.slice(0, SHOWN_CURVES));
  const box = el("div");
  out.appendChild(box);
  function draw() {
    box.replaceChildren();
    const idx = order.filter(i => shown.has(i));
    into(box, () => chart({xs: steps, xlabel: "step", series: [],
      lines: idx.map(i => { const r = runs[i], m = new Map(r.points.map(q => [q.step, q.peak_allocated_bytes])); return {name: r.name, color: runColor(i), dash: runDash(i), values: steps.map(s => m.has(s) ? m.get(s) : null)}; })}));
  }
  draw();
  if (runs.length > SHOWN_CURVES) {
    const more = el("details", undefined, "pick");
    more.appendChild(el("summary", `Curves shown: the ${SHOWN_CURVES} largest peaks; choose among all ${runs.length} runs`));
    for (const i of order) {
      const lab = el("label"), cb = el("input");
      cb.type = "checkbox"; cb.checked = shown.has(i);
      cb.onchange = () => { if (cb.checked) shown.add(i); else shown.delete(i); draw(); };
      const sw = el("i"); sw.style.background = runColor(i);
      lab.appendChild(cb); lab.appendChild(sw); lab.appendChild(document.createTextNode(runs[i].name + " (" + bytes(runs[i].peak_allocated) + ")"));
      more.appendChild(lab);
    }
    out.appendChild(more);
  }
}
if (runs.length === 1) {
  overview(runs[0]);
  details(runs[0]);
} else {
  sideBySide();
  if (runs.length > OPEN_SECTIONS) section("Each run (click one to open it)");
  runs.forEach(r => {
    if (runs.length <= OPEN_SECTIONS) {
      out.appendChild(el("h2", "Run " + r.name));
      overview(r);
      details(r);
      return;
    }
    // Many runs: each run's section is made when opened.
    const d = el("details", undefined, "run");
    d.appendChild(el("summary", "Run " + r.name + " (peak allocated " + bytes(r.peak_allocated) + ")"));
    d.addEventListener("toggle", () => { if (d.open && !d.dataset.made) { d.dataset.made = "1"; into(d, () => { overview(r); details(r); }); } });
    out.appendChild(d);
  });
}
if (document.body.dataset.rendered !== "error") document.body.dataset.rendered = "ok";
