// The Pathways side panel: one cluster's status tables, placement map and live
// timeline, polled from the Jupyter server extension (pathways_nb.lab) while visible.
import { Widget } from '@lumino/widgets';
import { drawPictures, fetchBoard, getJSON, showError, Board } from './board';

export interface Cluster {
  address: string;
  source: string;
  stoppable?: boolean;
}

/** The code a notebook runs to use the cluster at ``address``. */
export function connectCode(address: string): string {
  return `import pathways_nb as pw\n\nclient = pw.Client(${JSON.stringify(address)})`;
}

const BOARD_MS = 1000;
const CLUSTERS_MS = 5000;

export class PathwaysPanel extends Widget {
  private select = document.createElement('select');
  private input = document.createElement('input');
  private message = document.createElement('p');
  private problems = document.createElement('p');
  private status = document.createElement('div');
  private placement = document.createElement('div');
  private timeline = document.createElement('div');
  private islands = document.createElement('input');
  private devices = document.createElement('input');
  private platform = document.createElement('select');
  private tls = document.createElement('input');
  // The connect cell of the board last drawn, and whose it is.
  private connect: { address: string; code: string } | undefined;
  private start = document.createElement('button');
  private stop = document.createElement('button');
  private insert = document.createElement('button');
  private timers: number[] = [];
  private address = '';
  private stoppable = new Set<string>();
  // Set once the panel stopped the cluster it showed: it then waits for a choice
  // instead of showing another cluster on its own.
  private stopped = false;
  private busy = false;

  /** ``openTab(address)`` opens the cluster's timeline in the main area;
   * ``insertCode(code)`` puts code in a new cell of the current notebook (false when
   * no notebook is open). */
  constructor(
    private openTab: (address: string) => void,
    private insertCode: (code: string) => Promise<boolean>
  ) {
    super();
    this.id = 'pathways-nb-panel';
    this.addClass('pw-panel');
    this.title.caption = 'Pathways: islands, slices, tenants, placement and timeline';

    const bar = document.createElement('div');
    bar.className = 'pw-panel-bar';
    this.select.className = 'pw-panel-clusters';
    this.select.title = 'clusters found: your pw.LocalClusters and $PATHWAYS_ADDRESS';
    this.select.onchange = () => this.select.value && this.showCluster(this.select.value);
    this.input.className = 'pw-panel-address';
    this.input.placeholder = 'tcp://host:8786';
    this.input.title = 'a Dask scheduler address of a pathways_nb cluster';
    this.input.onkeydown = (e: KeyboardEvent) => {
      if (e.key === 'Enter') this.showCluster(this.input.value.trim());
    };
    const go = document.createElement('button');
    go.className = 'pw-panel-show jp-mod-styled';
    go.textContent = 'Show';
    go.onclick = () => this.showCluster(this.input.value.trim());
    bar.append(this.select, this.input, go);

    // A cluster of the Jupyter server's own, as Dask's JupyterLab extension starts one.
    const launch = document.createElement('div');
    launch.className = 'pw-panel-bar pw-panel-launch';
    const size = (el: HTMLInputElement, cls: string, value: string, title: string) => {
      el.type = 'number';
      el.min = '1';
      el.value = value;
      el.className = cls;
      el.title = title;
    };
    size(this.islands, 'pw-panel-islands', '2', 'islands: one worker host each');
    size(this.devices, 'pw-panel-devices', '4', 'devices per island');
    this.platform.className = 'pw-panel-platform';
    this.platform.title = "the hosts' devices";
    for (const [value, text] of [
      ['cpu', 'simulated CPUs'],
      ['auto', "this machine's accelerators"]
    ]) {
      const o = document.createElement('option');
      o.value = value;
      o.textContent = text;
      this.platform.append(o);
    }
    this.start.className = 'pw-panel-start jp-mod-styled';
    this.start.textContent = 'Start a cluster';
    this.start.title = 'start a local cluster of this many islands and devices per island';
    this.start.onclick = () => void this.startCluster();
    const label = (text: string, el: HTMLElement) => {
      const l = document.createElement('label');
      l.append(text, el);
      return l;
    };
    this.tls.type = 'checkbox';
    this.tls.className = 'pw-panel-tls';
    this.tls.title = 'every link over TLS, on certificates made for this cluster';
    launch.append(
      label('islands ', this.islands),
      label('devices ', this.devices),
      this.platform,
      label('TLS ', this.tls),
      this.start
    );

    const actions = document.createElement('div');
    actions.className = 'pw-panel-bar pw-panel-actions';
    this.insert.className = 'pw-panel-insert jp-mod-styled';
    this.insert.textContent = 'Insert pw.Client';
    this.insert.title = 'a new cell below the current one that connects to this cluster';
    this.insert.onclick = () => void this.insertConnect();
    this.stop.className = 'pw-panel-stop jp-mod-styled';
    this.stop.textContent = 'Stop this cluster';
    this.stop.title = 'stop the cluster this panel started (its notebooks lose their slices)';
    this.stop.onclick = () => void this.stopCluster();
    this.stop.hidden = true;
    actions.append(this.insert, this.stop);

    this.message.className = 'pw-panel-message';
    this.problems.className = 'pw-panel-problems pw-panel-error';
    this.status.className = 'pw-panel-status pw-status';
    this.placement.className = 'pw-panel-placement';
    this.timeline.className = 'pw-panel-timeline pw-timeline';
    const h = (text: string) => {
      const el = document.createElement('h3');
      el.textContent = text;
      return el;
    };
    // The pictures first, the tables (status summary, islands, ..., events) below.
    this.node.append(
      bar,
      launch,
      actions,
      this.problems,
      this.message,
      h('placement'),
      this.placement,
      h('timeline: the last 10 s'),
      this.tabButton(),
      this.timeline,
      this.status
    );
  }

  private tabButton(): HTMLButtonElement {
    const b = document.createElement('button');
    b.className = 'pw-panel-open-tab jp-mod-styled';
    b.textContent = 'Open in a tab';
    b.title = "this cluster's placement and timeline at the main area's width";
    b.onclick = () => this.address && this.openTab(this.address);
    return b;
  }

  /** Show the cluster at this address from now on. */
  showCluster(address: string): void {
    if (!address) return;
    this.address = address;
    this.stopped = false;
    this.stop.hidden = !this.stoppable.has(address);
    this.say(`connecting to ${address}…`);
    void this.refresh();
  }

  private say(text: string, error = false): void {
    this.message.classList.toggle('pw-panel-error', error);
    this.message.textContent = text;
  }

  /** Ask the server to ``what`` (start or stop a cluster) with ``button`` disabled
   * meanwhile; the reply, or undefined once the message line says why not. */
  private async act<T>(
    button: HTMLButtonElement,
    what: string,
    query: string,
    init: RequestInit
  ): Promise<T | undefined> {
    button.disabled = true;
    try {
      const reply = await getJSON<T & { error?: string }>('clusters', query, init);
      if (reply.error) {
        this.say(reply.error, true);
        return undefined;
      }
      return reply;
    } catch (err) {
      this.say(`cannot ${what}: ${err}`, true);
      return undefined;
    } finally {
      button.disabled = false;
    }
  }

  private async startCluster(): Promise<void> {
    const islands = Number(this.islands.value);
    const devices = Number(this.devices.value);
    const platform = this.platform.value;
    const tls = this.tls.checked;
    const what = `${islands} islands x ${devices} devices${tls ? ' with TLS' : ''}`;
    this.say(`starting a cluster of ${what}…`);
    const body = JSON.stringify({ islands, devices_per_island: devices, platform, tls });
    const started = await this.act<Cluster>(this.start, 'start a cluster', '', {
      method: 'POST',
      body
    });
    if (!started) return;
    this.stoppable.add(started.address);
    this.showCluster(started.address);
    await this.findClusters();
  }

  private async stopCluster(): Promise<void> {
    const address = this.address;
    if (!address) return;
    const query = `?address=${encodeURIComponent(address)}`;
    if (!(await this.act<object>(this.stop, 'stop the cluster', query, { method: 'DELETE' }))) {
      return;
    }
    this.stoppable.delete(address);
    this.address = '';
    this.stopped = true;
    this.stop.hidden = true;
    this.say(`stopped the cluster at ${address}; choose another above, or start one`);
    this.placement.replaceChildren();
    this.timeline.replaceChildren();
    this.status.replaceChildren();
    await this.findClusters();
  }

  private async insertConnect(): Promise<void> {
    if (!this.address) {
      this.say('choose or start a cluster first', true);
      return;
    }
    const known = this.connect?.address === this.address ? this.connect.code : undefined;
    if (!(await this.insertCode(known ?? connectCode(this.address)))) {
      this.say('open a notebook to insert the code into', true);
    }
  }

  /** Poll only while the panel is visible. */
  protected onAfterShow(): void {
    void this.findClusters();
    this.timers.push(
      window.setInterval(() => void this.refresh(), BOARD_MS),
      window.setInterval(() => void this.findClusters(), CLUSTERS_MS)
    );
  }

  protected onAfterHide(): void {
    this.timers.forEach(t => window.clearInterval(t));
    this.timers = [];
  }

  dispose(): void {
    this.onAfterHide();
    super.dispose();
  }

  private async findClusters(): Promise<void> {
    let clusters: Cluster[];
    let problems: string[];
    try {
      ({ clusters, problems } = await getJSON<{ clusters: Cluster[]; problems: string[] }>(
        'clusters'
      ));
    } catch (err) {
      this.message.textContent = `cannot list clusters: ${err}`;
      return;
    }
    this.problems.textContent = problems.join('\n');
    this.stoppable = new Set(clusters.filter(c => c.stoppable).map(c => c.address));
    this.stop.hidden = !this.stoppable.has(this.address);
    const known = clusters.map(c => c.address);
    const options = [...known];
    if (this.address && !known.includes(this.address)) options.push(this.address);
    if (!this.address && this.stopped) options.unshift('');
    const current = [...this.select.options].map(o => o.value);
    if (current.join('\n') !== options.join('\n')) {
      this.select.replaceChildren(
        ...options.map(a => {
          const o = document.createElement('option');
          const c = clusters.find(x => x.address === a);
          o.value = a;
          o.textContent = !a ? 'choose a cluster…' : c ? `${a} (${c.source})` : a;
          return o;
        })
      );
    }
    if (!this.address && !this.stopped && options.length) {
      this.showCluster(options[0]);
    } else if (!options.length && !this.stopped) {
      this.message.textContent =
        'no cluster found: start one here or a pw.LocalCluster in a notebook, or type a ' +
        'scheduler address';
    }
    this.select.value = this.address;
  }

  private async refresh(): Promise<void> {
    if (!this.address || this.busy || !this.isVisible) return;
    this.busy = true;
    const address = this.address;
    try {
      const board = await fetchBoard(address);
      if (address === this.address) this.draw(board);
    } catch (err) {
      this.message.textContent = `cannot reach the Jupyter server: ${err}`;
    } finally {
      this.busy = false;
    }
  }

  private draw(board: Board): void {
    if (showError(this.message, board)) return;
    if (board.connect) this.connect = { address: board.address, code: board.connect };
    this.message.textContent = board.address;
    this.status.innerHTML = board.html ?? '';
    // At the panel's width (less its padding): widening the sidebar widens the timeline.
    drawPictures(board, this.placement, this.timeline, this.node.clientWidth - 20);
  }
}
