/**
 * The sandbox-kernel JupyterLab extension: a left side panel (sandboxes, snapshots,
 * files), a status bar item naming the current notebook's sandbox, palette commands.
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import {
  fileUploadIcon,
  PanelWithToolbar,
  refreshIcon,
  SidePanel,
  ToolbarButton
} from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { AccordionPanel } from '@lumino/widgets';

import { SandboxAPI } from './api';
import {
  askSnapshot,
  confirmDestroy,
  FilesView,
  notifyError,
  SandboxesView,
  SnapshotsView
} from './components';
import { sandboxIcon } from './icons';
import { FilesModel, SandboxesModel } from './model';
import { SandboxStatus } from './status';

export const PANEL_ID = 'sandbox-kernel-panel';

namespace CommandIDs {
  export const open = 'sandbox-kernel:open';
  export const refresh = 'sandbox-kernel:refresh';
  export const reveal = 'sandbox-kernel:reveal-current';
  export const destroy = 'sandbox-kernel:destroy-current';
  export const snapshot = 'sandbox-kernel:snapshot-current';
}

/** The side panel; it tells the model when it is seen, so polling stands by while hidden. */
class SandboxSidePanel extends SidePanel {
  constructor(readonly model: SandboxesModel) {
    super();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.model.visible = true;
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this.model.visible = false;
  }
}

function section(
  title: string,
  body: SandboxesView | SnapshotsView | FilesView
): PanelWithToolbar {
  const panel = new PanelWithToolbar();
  panel.title.label = title;
  panel.addClass('jp-SandboxPanel-section');
  panel.addWidget(body);
  return panel;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'sandbox-kernel-labextension:plugin',
  description:
    'Side panel for the sandboxes of sandbox-kernel: state, use, files, snapshots.',
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette, INotebookTracker, IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null,
    notebooks: INotebookTracker | null,
    statusBar: IStatusBar | null
  ) => {
    const api = new SandboxAPI(app.serviceManager.serverSettings);
    const model = new SandboxesModel({ api });
    model.visible = false; // until the panel is shown
    const files = new FilesModel(api);

    const panel = new SandboxSidePanel(model);
    panel.id = PANEL_ID;
    panel.addClass('jp-SandboxPanel');
    panel.title.icon = sandboxIcon;
    panel.title.caption = 'Sandboxes';

    const browse = (id: string) => {
      const accordion = panel.content as AccordionPanel;
      const index = accordion.widgets.indexOf(filesSection);
      if (index >= 0) {
        accordion.expand(index);
      }
      void files.open(id, '');
    };
    const sandboxesView = new SandboxesView(model, files, browse);
    const filesView = new FilesView(files);
    const sandboxesSection = section('Sandboxes', sandboxesView);
    const snapshotsSection = section('Snapshots', new SnapshotsView(model));
    const filesSection = section('Files', filesView);
    filesSection.toolbar.addItem(
      'upload',
      new ToolbarButton({
        icon: fileUploadIcon,
        tooltip: 'Upload files into the folder shown',
        onClick: () => filesView.pickFiles()
      })
    );
    panel.toolbar.addItem(
      'refresh',
      new ToolbarButton({
        icon: refreshIcon,
        tooltip: 'Refresh sandboxes and snapshots',
        onClick: () => void app.commands.execute(CommandIDs.refresh)
      })
    );
    panel.addWidget(sandboxesSection);
    panel.addWidget(snapshotsSection);
    panel.addWidget(filesSection);

    // The files of a destroyed sandbox are gone from view with it.
    model.changed.connect(() => {
      if (
        files.sandboxId &&
        model.loaded &&
        !model.error &&
        !model.find(files.sandboxId)
      ) {
        void files.open(null);
      }
    });

    app.shell.add(panel, 'left', { rank: 650 });
    restorer?.add(panel, PANEL_ID);

    const currentKernelId = (): string | null =>
      notebooks?.currentWidget?.sessionContext.session?.kernel?.id ?? null;
    const currentSandbox = async () => {
      if (!model.loaded || !model.findByKernel(currentKernelId())) {
        await model.update();
      }
      return model.findByKernel(currentKernelId());
    };
    const hasNotebook = () => !!notebooks?.currentWidget;

    app.commands.addCommand(CommandIDs.open, {
      label: 'Show Sandboxes Panel',
      caption: 'Open the side panel listing your sandboxes',
      execute: () => app.shell.activateById(PANEL_ID)
    });
    app.commands.addCommand(CommandIDs.refresh, {
      label: 'Refresh Sandboxes',
      caption: 'Fetch sandboxes and snapshots now',
      icon: refreshIcon,
      execute: async () => {
        await model.refresh().catch(() => undefined);
        if (files.sandboxId) {
          await files.reload();
        }
      }
    });
    app.commands.addCommand(CommandIDs.reveal, {
      label: 'Reveal Current Notebook’s Sandbox',
      isEnabled: hasNotebook,
      execute: async () => {
        const sandbox = await currentSandbox();
        app.shell.activateById(PANEL_ID);
        if (sandbox) {
          model.reveal(sandbox.id);
        } else {
          notifyError(
            'Finding the notebook’s sandbox',
            new Error(
              'this notebook’s kernel has no sandbox yet (run a cell first)'
            )
          );
        }
      }
    });
    app.commands.addCommand(CommandIDs.destroy, {
      label: 'Destroy Current Notebook’s Sandbox…',
      isEnabled: hasNotebook,
      execute: async () => {
        const sandbox = await currentSandbox();
        if (!sandbox) {
          notifyError(
            'Destroying the notebook’s sandbox',
            new Error('this notebook’s kernel has no sandbox yet')
          );
          return;
        }
        await confirmDestroy(model, sandbox);
      }
    });
    app.commands.addCommand(CommandIDs.snapshot, {
      label: 'Snapshot Current Notebook’s Sandbox…',
      isEnabled: hasNotebook,
      execute: async () => {
        const sandbox = await currentSandbox();
        if (!sandbox) {
          notifyError(
            'Snapshot of the notebook’s sandbox',
            new Error('this notebook’s kernel has no sandbox yet')
          );
          return;
        }
        await askSnapshot(model, sandbox);
      }
    });
    if (palette) {
      for (const command of Object.values(CommandIDs)) {
        palette.addItem({ command, category: 'Sandboxes' });
      }
    }

    if (statusBar && notebooks) {
      const status = new SandboxStatus(
        model,
        notebooks,
        () => void app.commands.execute(CommandIDs.reveal)
      );
      statusBar.registerStatusItem('sandbox-kernel:status', {
        item: status,
        align: 'left',
        rank: 5,
        isActive: () => status.isRelevant,
        activeStateChanged: status.relevanceChanged
      });
    }
  }
};

export default plugin;
