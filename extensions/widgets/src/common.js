// Shared by the widgets: a tiny DOM helper and the tenant palette (same as _svg.py).
export const PALETTE = ["#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb"];

export function svgEl(name, attrs = {}, text) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

export function errorLine(model) {
  const p = document.createElement("p");
  p.className = "pw-error";
  p.style.color = "#c00";
  const show = () => { p.textContent = model.get("error") || ""; };
  show();
  model.on("change:error", show);
  return { el: p, off: () => model.off("change:error", show) };
}
