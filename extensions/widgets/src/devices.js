// The placement map: one row of cells per island, one cell per device, coloured by the
// slice that holds it and labelled with the program that last ran there.
import { PALETTE, errorLine } from "./common.js";

export function table(devices) {
  const islands = [...new Set(devices.map((d) => d.island))].sort();
  const slices = [...new Set(devices.map((d) => d.slice).filter(Boolean))].sort();
  const colour = new Map(slices.map((s, i) => [s, PALETTE[i % PALETTE.length]]));
  const t = document.createElement("table");
  t.className = "pw-devices";
  for (const island of islands) {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.textContent = island;
    tr.appendChild(th);
    for (const d of devices.filter((x) => x.island === island).sort((a, b) => a.device - b.device)) {
      const td = document.createElement("td");
      td.className = d.slice ? "held" : "free";
      td.dataset.device = String(d.device);
      td.style.background = d.slice ? colour.get(d.slice) : "#f4f4f4";
      td.style.padding = "4px 8px";
      td.style.color = d.slice ? "white" : "#666";
      td.textContent = `${d.device}${d.slice ? ` ${d.slice}` : " free"}${d.program ? ` · ${d.program}` : ""}`;
      tr.appendChild(td);
    }
    t.appendChild(tr);
  }
  return t;
}

function render({ model, el }) {
  const err = errorLine(model);
  const draw = () => el.replaceChildren(table(model.get("devices")), err.el);
  draw();
  model.on("change:devices", draw);
  return () => { model.off("change:devices", draw); err.off(); };
}

export default { render };
