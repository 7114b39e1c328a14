// The Pathways side panel: one cluster's status tables, placement map and live
// timeline, polled from the Jupyter server extension (pathways_nb.lab) while visible.
import { Widget } from '@lumino/widgets';
import { drawPictures, fetchBoard, getJSON, showError, Board } from './board';

export interface Cluster {
  address: string;
  source: string;
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
  private timers: number[] = [];
  private address = '';
  private busy = false;

  /** ``openTab(address)`` opens the cluster's timeline in the main area. */
  constructor(private openTab: (address: string) => void) {
    super();
    this.id = 'pathways-nb-panel';
    this.addClass('pw-panel');
    this.title.caption = 'Pathways: islands, slices, tenants, placement and timeline';

    const bar = document.createElement('div');
    bar.className = 'pw-panel-bar';
    this.select.className = 'pw-panel-clusters';
    this.select.title = 'clusters found: your pw.LocalClusters and $PATHWAYS_ADDRESS';
    this.select.onchange = () => this.showCluster(this.select.value);
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
    this.message.textContent = `connecting to ${address}…`;
    void this.refresh();
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
    const known = clusters.map(c => c.address);
    const options = [...known];
    if (this.address && !known.includes(this.address)) options.push(this.address);
    const current = [...this.select.options].map(o => o.value);
    if (current.join('\n') !== options.join('\n')) {
      this.select.replaceChildren(
        ...options.map(a => {
          const o = document.createElement('option');
          const c = clusters.find(x => x.address === a);
          o.value = a;
          o.textContent = c ? `${a} (${c.source})` : a;
          return o;
        })
      );
    }
    if (!this.address && options.length) {
      this.showCluster(options[0]);
    } else if (!options.length) {
      this.message.textContent =
        'no cluster found: start a pw.LocalCluster in a notebook, or type a scheduler address';
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
    this.message.textContent = board.address;
    this.status.innerHTML = board.html ?? '';
    // At the panel's width (less its padding): widening the sidebar widens the timeline.
    drawPictures(board, this.placement, this.timeline, this.node.clientWidth - 20);
  }
}
