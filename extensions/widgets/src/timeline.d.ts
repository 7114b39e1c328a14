// Types of timeline.js, for the JupyterLab panel (extensions/lab), which draws with it too.
export interface TimelineRow {
  lid: number;
  tenant: number;
  kind: "program" | "transfer";
  name: string;
  lane: string;
  launch: number;
  start: number;
  end: number | null;
  failed: boolean;
  source?: string;
  bytes?: number;
}
export function draw(rows: TimelineRow[], lanes: string[], width?: number): SVGSVGElement;
declare const _default: { render: (args: { model: unknown; el: HTMLElement }) => () => void };
export default _default;
