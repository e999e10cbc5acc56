// The node heat map: one tile per node on a single <canvas>, one cell per GPU coloured by
// its state. Hover names the node; a click calls onPick(node id). However many nodes the
// cluster has, this is two DOM elements and a few milliseconds of drawing.
"use strict";

// The letters of GET /api/dashboard/overview's "heat" rows (mgpu.master.dashboard).
const HEAT_WORDS = { b: "busy", s: "shared", f: "free", x: "used outside mgpu", n: "not offered", d: "down" };
const HEAT_VARS = { b: "--busy", s: "--shared", f: "--free", x: "--foreign", n: "--held", d: "--bad" };
const TILE_BG = {
  online: "#eef0f4", draining: "#fbe6c4", drained: "#d9dde5", reconnecting: "#fdf3e2", offline: "#f6d6d3",
};

class HeatMap {
  constructor(root, onPick) {
    this.root = root;
    this.onPick = onPick;
    this.canvas = document.createElement("canvas");
    this.canvas.setAttribute("role", "img");
    this.tip = document.createElement("div");
    this.tip.className = "heat-tip";
    this.tip.hidden = true;
    root.append(this.canvas, this.tip);
    this.rows = [];
    this.layout = null;
    this.canvas.addEventListener("mousemove", (ev) => this.hover(ev));
    this.canvas.addEventListener("mouseleave", () => { this.tip.hidden = true; });
    this.canvas.addEventListener("click", (ev) => {
      const row = this.at(ev);
      if (row) this.onPick(row[0]);
    });
  }

  // rows: [[node id, state, GPU letters]]; keep(row): false dims the tile; marked: ids outlined.
  draw(rows, keep = () => true, marked = new Set()) {
    this.rows = rows;
    const width = Math.max(200, this.root.clientWidth || 800);
    const L = this.layout = HeatMap.layoutFor(rows, width);
    const ratio = window.devicePixelRatio || 1;
    this.canvas.width = Math.round(width * ratio);
    this.canvas.height = Math.round(L.height * ratio);
    this.canvas.style.width = width + "px";
    this.canvas.style.height = L.height + "px";
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    const css = getComputedStyle(document.documentElement);
    const colour = {};
    for (const [k, v] of Object.entries(HEAT_VARS)) colour[k] = css.getPropertyValue(v).trim() || "#888";
    let dimmed = 0;
    rows.forEach((row, i) => {
      const [x, y] = this.origin(i);
      const kept = keep(row);
      if (!kept) dimmed++;
      ctx.globalAlpha = kept ? 1 : 0.18;
      ctx.fillStyle = TILE_BG[row[1]] || TILE_BG.online;
      ctx.fillRect(x, y, L.tw, L.th);
      const letters = row[2];
      for (let g = 0; g < letters.length; g++) {
        ctx.fillStyle = colour[letters[g]] || "#888";
        ctx.fillRect(x + L.pad + (g % L.cols) * (L.cell + 1), y + L.pad + Math.floor(g / L.cols) * (L.cell + 1), L.cell, L.cell);
      }
      if (marked.has(row[0])) {
        ctx.globalAlpha = 1;
        ctx.strokeStyle = css.getPropertyValue("--ink").trim() || "#000";
        ctx.lineWidth = 2;
        ctx.strokeRect(x - 1, y - 1, L.tw + 2, L.th + 2);
      }
    });
    ctx.globalAlpha = 1;
    this.canvas.dataset.nodes = rows.length;
    this.canvas.dataset.dimmed = dimmed;
    this.canvas.setAttribute("aria-label", `GPU heat map of ${rows.length} nodes`);
  }

  // Cells of 4 to 10 px (smaller as nodes grow), 4 GPUs a line: 8 GPUs make a 2-line tile.
  static layoutFor(rows, width) {
    let most = 1;
    for (const r of rows) most = Math.max(most, r[2].length);
    const cell = rows.length <= 64 ? 10 : rows.length <= 300 ? 6 : 4;
    const cols = Math.min(most, 4), lines = Math.ceil(most / cols);
    const pad = 2, gap = 3;
    const tw = cols * (cell + 1) - 1 + 2 * pad, th = lines * (cell + 1) - 1 + 2 * pad;
    const perRow = Math.max(1, Math.floor((width + gap) / (tw + gap)));
    const height = Math.max(1, Math.ceil(rows.length / perRow)) * (th + gap) + 2;
    return { cell, cols, pad, gap, tw, th, perRow, height };
  }

  origin(i) {
    const L = this.layout;
    return [1 + (i % L.perRow) * (L.tw + L.gap), 1 + Math.floor(i / L.perRow) * (L.th + L.gap)];
  }

  at(ev) {
    const L = this.layout;
    if (!L) return null;
    const r = this.canvas.getBoundingClientRect();
    const px = ev.clientX - r.left - 1, py = ev.clientY - r.top - 1;
    const col = Math.floor(px / (L.tw + L.gap)), line = Math.floor(py / (L.th + L.gap));
    if (col < 0 || col >= L.perRow || px - col * (L.tw + L.gap) > L.tw) return null;
    return this.rows[line * L.perRow + col] || null;
  }

  hover(ev) {
    const row = this.at(ev);
    if (!row) { this.tip.hidden = true; return; }
    const counts = {};
    for (const c of row[2]) counts[c] = (counts[c] || 0) + 1;
    const gpus = Object.entries(counts).map(([c, n]) => `${n} ${HEAT_WORDS[c] || c}`).join(", ");
    this.tip.textContent = `${row[0]} · ${row[1]} · ${gpus || "no GPUs"}`;
    this.tip.hidden = false;
    const box = this.root.getBoundingClientRect();
    this.tip.style.left = Math.min(ev.clientX - box.left + 12, box.width - 220) + "px";
    this.tip.style.top = (ev.clientY - box.top + 14) + "px";
  }
}
