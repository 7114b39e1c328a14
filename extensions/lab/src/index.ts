// pathways_nb's JupyterLab extension: the Pathways side panel in the left sidebar, kept
// open across reloads, and a command (in the palette) that shows it.
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';
import { PathwaysPanel } from './panel';
import { TimelineTab } from './timeline_tab';

// Four devices, two held by a slice: drawn inline, so no network is needed.
const icon = new LabIcon({
  name: 'pathways-nb:icon',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<rect x="1" y="1" width="6" height="6" rx="1"/><rect x="9" y="1" width="6" height="6" rx="1"/>' +
    '<rect x="1" y="9" width="6" height="6" rx="1" fill-opacity="0.4"/>' +
    '<rect x="9" y="9" width="6" height="6" rx="1" fill-opacity="0.4"/></g></svg>'
});

const OPEN = 'pathways-nb:open-panel';
const OPEN_TAB = 'pathways-nb:open-timeline';
// JupyterLab's own notebook commands: they act on the notebook last focused.
const INSERT_BELOW = 'notebook:insert-cell-below';
const REPLACE_SELECTION = 'notebook:replace-selection';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'pathways-nb-lab:panel',
  description: 'A side panel showing a pathways_nb cluster: placement, timeline, status.',
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null
  ) => {
    // Open timeline tabs are tracked, so a reload opens them again.
    const tabs = new WidgetTracker<MainAreaWidget<TimelineTab>>({ namespace: 'pathways-nb' });
    app.commands.addCommand(OPEN_TAB, {
      label: 'Open a Pathways timeline in a tab',
      execute: args => {
        const address = String(args.address ?? '');
        const content = new TimelineTab(address);
        const tab = new MainAreaWidget({ content });
        tab.id = `pathways-nb-timeline-${address}`;
        tab.title.label = content.title.label;
        tab.title.caption = content.title.caption;
        tab.title.closable = true;
        tab.title.icon = icon;
        void tabs.add(tab);
        app.shell.add(tab, 'main');
        app.shell.activateById(tab.id);
      }
    });
    if (restorer) {
      void restorer.restore(tabs, {
        command: OPEN_TAB,
        args: tab => ({ address: tab.content.address }),
        name: tab => tab.content.address
      });
    }
    const openTab = (address: string) => {
      const open = tabs.find(tab => tab.content.address === address);
      if (open) {
        app.shell.activateById(open.id);
      } else {
        void app.commands.execute(OPEN_TAB, { address });
      }
    };
    // Code goes into a new cell below the current notebook's active cell.
    const insertCode = async (code: string): Promise<boolean> => {
      if (!app.commands.isEnabled(INSERT_BELOW)) return false;
      await app.commands.execute(INSERT_BELOW);
      await app.commands.execute(REPLACE_SELECTION, { text: code });
      return true;
    };
    const panel = new PathwaysPanel(openTab, insertCode);
    panel.title.icon = icon;
    app.shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, panel.id);
    app.commands.addCommand(OPEN, {
      label: 'Show the Pathways panel',
      caption: 'A pathways_nb cluster: placement, timeline and status tables',
      execute: () => app.shell.activateById(panel.id)
    });
    palette?.addItem({ command: OPEN, category: 'Pathways' });
  }
};

export default plugin;
