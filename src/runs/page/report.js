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
const RUN_COLORS = ["#4e79a7","#e15759","#59a14f","#f28e2b","#b07aa1","#76b7b2","#edc948","#9c755f"];
function el(tag, text, cls) { const e = document.createElement(tag); if (text !== undefined) e.textContent = text; if (cls) e.className = cls; return e; }
function svgEl(tag, attrs) { const e = document.createElementNS(NS, tag); for (const k in attrs) e.setAttribute(k, attrs[k]); return e; }
function bytes(n) { if (n === null || n === undefined) return "-"; const u = ["B","KiB","MiB","GiB","TiB"]; let v = n, i = 0; while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; } return i ? v.toFixed(2) + " " + u[i] : n + " B"; }
function exact(n) { return n.toLocaleString("en-US") + " B"; }
function section(title) { app.appendChild(el("h2", title)); }
function table(headers, rows, opts) {
  opts = opts || {};
  const t = el("table"), head = el("tr");
  headers.forEach((h, i) => {
    const th = el("th", h, i === 0 || (opts.left || []).includes(i) ? "l" : "");
    if ((opts.sortable || []).includes(i)) { th.classList.add("sort"); th.title = "sort"; th.onclick = () => sortBy(i); }
    head.appendChild(th);
  });
  t.appendChild(head);
  const body = [];
  function fill(rs) { body.forEach(r => r.remove()); body.length = 0; rs.forEach(r => { const tr = el("tr"); r.cells.forEach((c, i) => tr.appendChild(el("td", String(c), i === 0 || (opts.left || []).includes(i) ? "l" : ""))); t.appendChild(tr); body.push(tr); }); }
  let dir = -1, last = -1;
  function sortBy(i) { dir = last === i ? -dir : -1; last = i; fill(rows.slice().sort((a, b) => dir * ((a.keys[i] ?? -1) - (b.keys[i] ?? -1)))); }
  fill(rows);
  app.appendChild(t);
  return t;
}
function chart(opts) {
  // opts: series [{name, color, values}] stacked as areas; lines [{name, color, values, dash}];
  // xs; markers [{x, y, label}]; vlines [{x, label}]
  const W = 1000, H = 300, L = 70, R = 10, T = 10, B = 30;
  const svg = svgEl("svg", {viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img"});
  const xs = opts.xs, n = xs.length;
  if (!n) return;
  const stacked = xs.map((_, i) => opts.series.reduce((s, se) => s + se.values[i], 0));
  let ymax = Math.max(1, ...stacked, ...opts.lines.flatMap(l => l.values.filter(v => v !== null)));
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  const X = x => L + (x - x0) / (x1 - x0) * (W - L - R), Y = y => T + (1 - y / ymax) * (H - T - B);
  for (let k = 0; k <= 4; k++) {
    const y = ymax * k / 4;
    svg.appendChild(svgEl("line", {x1: L, x2: W - R, y1: Y(y), y2: Y(y), stroke: "#eee"}));
    const t = svgEl("text", {x: L - 4, y: Y(y) + 4, "text-anchor": "end", "font-size": 11}); t.textContent = bytes(Math.round(y)); svg.appendChild(t);
  }
  const xl = svgEl("text", {x: W - R, y: H - 8, "text-anchor": "end", "font-size": 11}); xl.textContent = opts.xlabel + " " + x1; svg.appendChild(xl);
  const x0l = svgEl("text", {x: L, y: H - 8, "font-size": 11}); x0l.textContent = String(x0); svg.appendChild(x0l);
  let base = xs.map(() => 0);
  for (const se of opts.series) {
    const top = base.map((b, i) => b + se.values[i]);
    let d = "M" + xs.map((x, i) => X(x) + "," + Y(top[i])).join("L");
    d += "L" + xs.map((x, i) => X(x) + "," + Y(base[i])).reverse().join("L") + "Z";
    svg.appendChild(svgEl("path", {d, fill: se.color, "fill-opacity": 0.85, stroke: "none"}));
    base = top;
  }
  for (const l of opts.lines) {
    const pts = xs.map((x, i) => l.values[i] === null ? null : X(x) + "," + Y(l.values[i])).filter(p => p);
    if (pts.length) svg.appendChild(svgEl("path", {d: "M" + pts.join("L"), fill: "none", stroke: l.color, "stroke-width": 1.5, "stroke-dasharray": l.dash || ""}));
    // Few points (a run reported every n-th iteration): each one drawn, so none is lost.
    if (pts.length <= 60) for (const p of pts) { const [cx, cy] = p.split(","); svg.appendChild(svgEl("circle", {cx, cy, r: 2.5, fill: l.color})); }
  }
  for (const v of opts.vlines || []) {
    svg.appendChild(svgEl("line", {x1: X(v.x), x2: X(v.x), y1: T, y2: H - B, stroke: "#333", "stroke-dasharray": "4 3"}));
    const t = svgEl("text", {x: X(v.x) + 3, y: H - B - 4, "font-size": 11}); t.textContent = v.label; svg.appendChild(t);
  }
  for (const m of opts.markers || []) {
    svg.appendChild(svgEl("circle", {cx: X(m.x), cy: Y(m.y), r: 4, fill: "#b00"}));
    const t = svgEl("text", {x: Math.min(X(m.x) + 6, W - 200), y: Math.max(Y(m.y) - 6, T + 12), "font-size": 11, fill: "#b00"}); t.textContent = m.label; svg.appendChild(t);
  }
  app.appendChild(svg);
  const legend = el("div", undefined, "legend");
  for (const s of opts.series.concat(opts.lines)) { const sp = el("span"); const i = el("i"); i.style.background = s.color; sp.appendChild(i); sp.appendChild(document.createTextNode(s.name)); legend.appendChild(sp); }
  app.appendChild(legend);
}
function overview(r) {
  const p = r.points;
  table(["", "bytes", "exact", "at step"], [
    {cells: ["peak allocated", bytes(r.peak_allocated), exact(r.peak_allocated), r.peak_allocated_step], keys: []},
    {cells: [r.devices.includes("cpu") ? "peak resident (process)" : "peak reserved", bytes(r.peak_reserved), exact(r.peak_reserved), r.peak_reserved_step], keys: []},
  ]);
  app.appendChild(el("p", `${r.steps} reported iterations on ${r.devices.join(", ")}` + (p.length < r.steps ? `; the curve keeps ${p.length} points (each bucket's lowest and highest)` : ""), "muted"));
  chart({xs: p.map(q => q.step), xlabel: "step",
    series: [
      {name: "weights", color: COLORS.weights, values: p.map(q => q.weights_bytes)},
      {name: "gradients", color: COLORS.gradients, values: p.map(q => q.gradients_bytes)},
      {name: "optimizer state", color: COLORS.optimizer_state, values: p.map(q => q.optimizer_state_bytes)},
      {name: "other", color: COLORS.other, values: p.map(q => q.other_bytes)}],
    lines: [
      {name: "peak allocated", color: "#b00", values: p.map(q => q.peak_allocated_bytes)},
      {name: "feature maps", color: "#e15759", dash: "4 3", values: p.map(q => q.feature_maps_bytes)},
      {name: "intermediate gradients", color: "#b07aa1", dash: "2 2", values: p.map(q => q.intermediate_gradients_bytes)}]
      .concat(r.devices.includes("cpu") ? [] : [{name: "peak reserved", color: "#555", values: p.map(q => q.peak_reserved_bytes)}]),
    markers: [{x: r.peak_allocated_step, y: r.peak_allocated, label: "peak allocated " + bytes(r.peak_allocated) + " (step " + r.peak_allocated_step + ")"}]});
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
      r.params.map(q => ({cells: [q.name, q.kind, q.dtype, q.shape, bytes(q.bytes), bytes(q.grad_bytes)], keys: [0, 0, 0, 0, q.bytes, q.grad_bytes]})),
      {sortable: [4, 5], left: [1, 2, 3]});
  }
  if (r.timeline.length) {
    section("The profiled step (the run's peak step), op by op");
    const t = r.timeline, cats = ["param", "buffer", "grad", "act", "temp", "opt", "other"];
    const names = {param: "parameters", buffer: "buffers", grad: "gradients", act: "activations", temp: "temporaries", opt: "optimizer state", other: "other"};
    const bwd = t.find(q => q.phase === "backward"), opt = t.find(q => q.phase === "optimizer");
    const peak = t.reduce((a, q) => q.total_bytes > a.total_bytes ? q : a, t[0]);
    chart({xs: t.map(q => q.op_index), xlabel: "op", lines: [],
      series: cats.map(c => ({name: names[c], color: COLORS[c], values: t.map(q => q[c + "_bytes"])})),
      vlines: [bwd && {x: bwd.op_index, label: "backward"}, opt && {x: opt.op_index, label: "optimizer"}].filter(v => v),
      markers: [{x: peak.op_index, y: peak.total_bytes, label: "peak " + bytes(peak.total_bytes) + " at " + peak.op + " (" + peak.layer + ")"}]});
  }
  if (r.layers.length) {
    section("Layers of the profiled step");
    table(["layer", "parameters", "activations", "forward FLOPs", "backward FLOPs"],
      r.layers.map(l => ({cells: [l.layer, bytes(l.parameters_bytes), bytes(l.activation_bytes), l.forward_flops.toLocaleString("en-US"), l.backward_flops.toLocaleString("en-US")], keys: [0, l.parameters_bytes, l.activation_bytes, l.forward_flops, l.backward_flops]})),
      {sortable: [1, 2, 3, 4]});
  }
  if (r.leaks.length) {
    section("Leak suspects");
    table(["op", "phase", "layer", "epoch", "iterations", "count", "bytes"],
      r.leaks.map(k => ({cells: [k.op, k.phase, k.layer, k.epoch, k.first_iteration + "-" + k.last_iteration, k.count, bytes(k.bytes)], keys: []})), {left: [1, 2]});
  }
  for (const [name, text] of r.ooms) { section("Out of memory: " + name); app.appendChild(el("pre", text)); }
  for (const w of r.warnings) app.appendChild(el("p", "warning: " + w, "muted"));
}
if (runs.length === 1) {
  overview(runs[0]);
  details(runs[0]);
} else {
  section("Runs side by side");
  const mean = k => runs.reduce((s, r) => s + r[k], 0) / runs.length;
  const ma = mean("peak_allocated"), mr = mean("peak_reserved");
  const pct = (v, m) => m ? ((v - m) / m * 100).toFixed(1) + "%" : "-";
  table(["run", "device", "iterations", "peak allocated", "vs mean", "peak reserved / resident", "vs mean"],
    runs.map(r => ({cells: [r.name, r.devices.join(", "), r.steps, exact(r.peak_allocated), pct(r.peak_allocated, ma), exact(r.peak_reserved), pct(r.peak_reserved, mr)], keys: []})), {left: [1]});
  const steps = [...new Set(runs.flatMap(r => r.points.map(q => q.step)))].sort((a, b) => a - b);
  chart({xs: steps, xlabel: "step", series: [],
    lines: runs.map((r, i) => { const m = new Map(r.points.map(q => [q.step, q.peak_allocated_bytes])); return {name: r.name + " peak allocated", color: RUN_COLORS[i % RUN_COLORS.length], values: steps.map(s => m.has(s) ? m.get(s) : null)}; })});
  runs.forEach(r => { const h = el("h2", "Run " + r.name); app.appendChild(h); overview(r); details(r); });
}
if (document.body.dataset.rendered !== "error") document.body.dataset.rendered = "ok";
