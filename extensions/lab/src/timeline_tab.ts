// A cluster's placement map and timeline at the main area's width, polled from the
// Jupyter server extension while the tab is visible.
import { Widget } from '@lumino/widgets';
import { drawPictures, fetchBoard, showError } from './board';

const BOARD_MS = 1000;

export class TimelineTab extends Widget {
  private message = document.createElement('p');
  private placement = document.createElement('div');
  private timeline = document.createElement('div');
  private timer = 0;
  private busy = false;

  constructor(readonly address: string) {
    super();
    this.addClass('pw-panel');
    this.addClass('pw-timeline-tab');
    this.title.label = `Pathways: ${address}`;
    this.title.caption = `placement and timeline of the cluster at ${address}`;
    this.title.closable = true;
    this.message.className = 'pw-panel-message';
    this.placement.className = 'pw-panel-placement';
    this.timeline.className = 'pw-panel-timeline pw-timeline';
    this.node.append(this.message, this.placement, this.timeline);
  }

  protected onAfterShow(): void {
    void this.refresh();
    this.timer = window.setInterval(() => void this.refresh(), BOARD_MS);
  }

  protected onAfterHide(): void {
    window.clearInterval(this.timer);
  }

  dispose(): void {
    window.clearInterval(this.timer);
    super.dispose();
  }

  private async refresh(): Promise<void> {
    if (this.busy || !this.isVisible) return;
    this.busy = true;
    try {
      const board = await fetchBoard(this.address);
      if (showError(this.message, board)) return;
      this.message.textContent = `${board.summary ?? ''} · the last 10 s`;
      drawPictures(board, this.placement, this.timeline, this.node.clientWidth - 20);
    } catch (err) {
      this.message.textContent = `cannot reach the Jupyter server: ${err}`;
    } finally {
      this.busy = false;
    }
  }
}
