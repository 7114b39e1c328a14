// Types of devices.js, for the JupyterLab panel (extensions/lab), which draws with it too.
export interface DeviceRow {
  island: string;
  device: number;
  slice: string;
  program: string;
}
export function table(devices: DeviceRow[]): HTMLTableElement;
declare const _default: { render: (args: { model: unknown; el: HTMLElement }) => () => void };
export default _default;
