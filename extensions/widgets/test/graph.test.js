// @vitest-environment jsdom
// The graph widget draws DOT with the bundled Graphviz: one SVG group per node.
import { describe, expect, it } from "vitest";
import graph, { toSvg } from "../src/graph.js";

const DOT = `digraph "step" {
  subgraph cluster_0 { label="slice a"; n0 [label="input"]; n1 [label="encode"]; }
  subgraph cluster_1 { label="slice b"; n2 [label="decode"]; }
  n0 -> n1; n1 -> n2 [style=dashed];
}`;

describe("graph", () => {
  it("renders every node and edge", async () => {
    const svg = await toSvg(DOT);
    expect(svg.querySelectorAll("g.node").length).toBe(3);
    expect(svg.querySelectorAll("g.edge").length).toBe(2);
    expect(svg.querySelectorAll("g.cluster").length).toBe(2);
  });

  it("shows the source and the error for bad DOT", async () => {
    const state = { dot: "digraph { a -> }", title: "bad" };
    const model = { get: (k) => state[k], on() {}, off() {} };
    const el = document.createElement("div");
    await graph.render({ model, el });
    expect(el.querySelector("pre").textContent).toContain("digraph { a -> }");
  });
});
