// The timeline: one lane per slice, a bar per program or transfer, a dashed line for
// the time a launch waited before it started. Redrawn whenever the rows change.
import { PALETTE, svgEl, errorLine } from "./common.js";

const LANE_H = 26, BAR_H = 16;

// `width` in pixels: 900 in a notebook; JupyterLab's side panel draws at its own width,
// the lane labels taking at most a third of it.
export function draw(rows, lanes, width = 900) {
  const WIDTH = Math.max(width, 200), LEFT = Math.min(150, Math.round(WIDTH / 3));
  const height = LANE_H * lanes.length + 30;
  const svg = svgEl("svg", { width: WIDTH, height, "font-family": "sans-serif", "font-size": 11 });
  if (!rows.length) {
    svg.appendChild(svgEl("text", { x: 4, y: 14 }, "no programs in this window"));
    return svg;
  }
  const t0 = Math.min(...rows.map((r) => r.launch));
  const t1 = Math.max(...rows.map((r) => (r.end ?? r.start)));
  const span = Math.max(t1 - t0, 1e-3);
  const x = (t) => LEFT + ((t - t0) / span) * (WIDTH - LEFT - 10);
  const index = new Map(lanes.map((l, i) => [l, i]));
  lanes.forEach((lane, i) => {
    const y = 10 + i * LANE_H;
    svg.appendChild(svgEl("text", { x: 4, y: y + 12 }, lane));
    svg.appendChild(svgEl("line", { x1: LEFT, x2: WIDTH - 10, y1: y + LANE_H - 4, y2: y + LANE_H - 4, stroke: "#eee" }));
  });
  for (const r of rows) {
    const i = index.get(r.lane);
    if (i === undefined) continue;
    const y = 10 + i * LANE_H;
    const end = r.end ?? t1;
    const colour = r.kind === "transfer" ? "#999" : PALETTE[r.tenant % PALETTE.length];
    if (r.start > r.launch) {
      svg.appendChild(svgEl("line", {
        class: "queued", x1: x(r.launch), x2: x(r.start), y1: y + BAR_H / 2, y2: y + BAR_H / 2,
        stroke: colour, "stroke-dasharray": "2,2",
      }));
    }
    const rect = svgEl("rect", {
      class: r.kind, x: x(r.start), y, width: Math.max(1, x(end) - x(r.start)), height: BAR_H,
      fill: colour, stroke: r.failed ? "#c00" : "none", "data-lid": r.lid,
    });
    const what = r.kind === "transfer" ? `transfer from ${r.source}, ${r.bytes} B` : `program, tenant ${r.tenant}`;
    rect.appendChild(svgEl("title", {}, `${r.name} (${what}): ${(end - r.start).toFixed(2)} ms`));
    svg.appendChild(rect);
  }
  svg.appendChild(svgEl("text", { x: LEFT, y: height - 6 }, "0 ms"));
  svg.appendChild(svgEl("text", { x: WIDTH - 70, y: height - 6 }, `${span.toFixed(1)} ms`));
  return svg;
}

function render({ model, el }) {
  const box = document.createElement("div");
  box.className = "pw-timeline";
  const err = errorLine(model);
  const redraw = () => box.replaceChildren(draw(model.get("rows"), model.get("lanes")));
  redraw();
  model.on("change:rows", redraw);
  el.replaceChildren(box, err.el);
  return () => { model.off("change:rows", redraw); err.off(); };
}

export default { render };
