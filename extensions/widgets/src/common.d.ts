// Types of common.js, for the JupyterLab panel (extensions/lab), which draws with it too.
export const PALETTE: string[];
export function svgEl(name: string, attrs?: Record<string, unknown>, text?: string): SVGElement;
export function errorLine(model: unknown): { el: HTMLParagraphElement; off: () => void };
