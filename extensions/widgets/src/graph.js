// The dataflow graph: DOT drawn to SVG by Graphviz compiled to WebAssembly, bundled here.
import { instance } from "@viz-js/viz";

let viz;
export async function toSvg(dot) {
  viz ??= await instance();
  return viz.renderSVGElement(dot);
}

async function render({ model, el }) {
  const box = document.createElement("div");
  box.className = "pw-graph";
  const title = document.createElement("p");
  const draw = async () => {
    title.textContent = model.get("title");
    try {
      box.replaceChildren(await toSvg(model.get("dot")));
    } catch (e) {
      const pre = document.createElement("pre");
      pre.textContent = `${e}\n\n${model.get("dot")}`;
      box.replaceChildren(pre);
    }
  };
  await draw();
  model.on("change:dot", draw);
  el.replaceChildren(title, box);
  return () => model.off("change:dot", draw);
}

export default { render };
