// What the Jupyter server extension (pathways_nb.lab) serves for one cluster, how it is
// fetched, and how the panel and the timeline tabs draw its pictures.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { table, DeviceRow } from '../../widgets/src/devices.js';
import { draw, TimelineRow } from '../../widgets/src/timeline.js';
import { legend } from './legend';

export interface Board {
  address: string;
  error?: string;
  summary?: string;
  html?: string;
  devices?: DeviceRow[];
  rows?: TimelineRow[];
  lanes?: string[];
  tenants?: Record<string, string>;
  // The cell that connects a notebook to it (with its client certificate, under TLS).
  connect?: string;
}

/** A JSON answer of the server extension (to a GET, or to ``init``'s method and body);
 * an error status without an ``error`` in its body throws. */
export async function getJSON<T>(path: string, query = '', init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'pathways-nb', path) + query;
  const reply = await ServerConnection.makeRequest(url, init, settings);
  const body = await reply.json();
  if (!reply.ok && !(body && body.error)) {
    throw new Error(`${path}: the server answered ${reply.status}`);
  }
  return body as T;
}

export function fetchBoard(address: string): Promise<Board> {
  return getJSON<Board>('board', `?address=${encodeURIComponent(address)}`);
}

/** The message line says the board's error, if any: true when there is one. */
export function showError(message: HTMLElement, board: Board): boolean {
  message.classList.toggle('pw-panel-error', Boolean(board.error));
  if (board.error) message.textContent = board.error;
  return Boolean(board.error);
}

/** The placement map, and the timeline with its legend at ``width`` pixels. */
export function drawPictures(
  board: Board,
  placement: HTMLElement,
  timeline: HTMLElement,
  width: number
): void {
  placement.replaceChildren(table(board.devices ?? []));
  timeline.replaceChildren(
    legend(board.rows ?? [], board.tenants ?? {}),
    draw(board.rows ?? [], board.lanes ?? [], width)
  );
}
