// @vitest-environment jsdom
// The widgets' JavaScript against a fake anywidget model.
import { describe, expect, it } from "vitest";
import timeline, { draw } from "../src/timeline.js";
import devices from "../src/devices.js";
import status from "../src/status.js";

function fakeModel(state) {
  const handlers = {};
  return {
    get: (k) => state[k],
    set: (k, v) => { state[k] = v; },
    on: (ev, fn) => { (handlers[ev] ??= []).push(fn); },
    off: (ev, fn) => { handlers[ev] = (handlers[ev] ?? []).filter((f) => f !== fn); },
    emit: (k, v) => { state[k] = v; for (const fn of handlers[`change:${k}`] ?? []) fn(); },
    handlers,
  };
}

const rows = [
  { lid: 1, tenant: 1, kind: "program", name: "f", lane: "island0/s1", host: "h0", source: "", bytes: 0, launch: 0, start: 1, end: 3, failed: false },
  { lid: 2, tenant: 1, kind: "transfer", name: "transfer", lane: "island1/s2", host: "h1", source: "h0", bytes: 64, launch: 0.5, start: 3, end: 4, failed: false },
  { lid: 3, tenant: 2, kind: "program", name: "g", lane: "island1/s2", host: "h1", source: "", bytes: 0, launch: 0.5, start: 4, end: null, failed: false },
];

describe("timeline", () => {
  it("draws one bar per row and a queue line where a launch waited", () => {
    const svg = draw(rows, ["island0/s1", "island1/s2"]);
    expect(svg.querySelectorAll("rect").length).toBe(3);
    expect(svg.querySelectorAll("rect.transfer").length).toBe(1);
    expect(svg.querySelectorAll("line.queued").length).toBe(3);
    expect([...svg.querySelectorAll("rect")].map((r) => r.dataset.lid)).toEqual(["1", "2", "3"]);
  });

  it("draws at a given width, the lane labels taking at most a third", () => {
    const svg = draw(rows, ["island0/s1", "island1/s2"], 300);
    expect(svg.getAttribute("width")).toBe("300");
    const xs = [...svg.querySelectorAll("rect")].map((r) => Number(r.getAttribute("x")));
    const ends = [...svg.querySelectorAll("rect")].map(
      (r) => Number(r.getAttribute("x")) + Number(r.getAttribute("width")));
    expect(Math.min(...xs)).toBeGreaterThan(100);
    const starts = [...svg.querySelectorAll("line.queued")].map((l) => Number(l.getAttribute("x1")));
    expect(Math.min(...starts)).toBe(100); // the first launch, at the lanes' left edge
    expect(Math.max(...ends)).toBeLessThanOrEqual(300); // inside the drawing
    expect(draw(rows, ["island0/s1"]).getAttribute("width")).toBe("900");
  });

  it("redraws when the rows change and stops listening when removed", () => {
    const model = fakeModel({ rows: [], lanes: [], error: "" });
    const el = document.createElement("div");
    const cleanup = timeline.render({ model, el });
    expect(el.querySelectorAll("rect").length).toBe(0);
    model.state = undefined;
    model.set("lanes", ["island0/s1", "island1/s2"]);
    model.emit("rows", rows);
    expect(el.querySelectorAll("rect").length).toBe(3);
    cleanup();
    expect(model.handlers["change:rows"].length).toBe(0);
  });

  it("shows the error line", () => {
    const model = fakeModel({ rows: [], lanes: [], error: "" });
    const el = document.createElement("div");
    timeline.render({ model, el });
    model.emit("error", "BrokenError: controller gone");
    expect(el.querySelector(".pw-error").textContent).toBe("BrokenError: controller gone");
  });
});

describe("devices", () => {
  it("draws a cell per device, held or free", () => {
    const model = fakeModel({
      devices: [
        { island: "island0", device: 1, slice: "train", program: "step" },
        { island: "island0", device: 0, slice: "train", program: "step" },
        { island: "island1", device: 2, slice: "", program: "" },
      ],
      error: "",
    });
    const el = document.createElement("div");
    devices.render({ model, el });
    expect(el.querySelectorAll("td").length).toBe(3);
    expect(el.querySelectorAll("td.held").length).toBe(2);
    expect([...el.querySelectorAll("tr")[0].querySelectorAll("td")].map((t) => t.dataset.device)).toEqual(["0", "1"]);
    expect(el.querySelector("td.held").textContent).toContain("step");
  });
});

describe("status", () => {
  it("shows the tables Python rendered and follows changes", () => {
    const model = fakeModel({ html: "<table><tr><td>a</td></tr></table>", error: "" });
    const el = document.createElement("div");
    status.render({ model, el });
    expect(el.querySelectorAll("td").length).toBe(1);
    model.emit("html", "<table><tr><td>a</td><td>b</td></tr></table>");
    expect(el.querySelectorAll("td").length).toBe(2);
  });
});
