// Cluster status: the tables Python renders from client.status(), refreshed live.
import { errorLine } from "./common.js";

function render({ model, el }) {
  const box = document.createElement("div");
  box.className = "pw-status";
  const err = errorLine(model);
  const draw = () => { box.innerHTML = model.get("html"); };
  draw();
  model.on("change:html", draw);
  el.replaceChildren(box, err.el);
  return () => { model.off("change:html", draw); err.off(); };
}

export default { render };
