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
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';
import {
  CommandToolbarButton,
  fileUploadIcon,
  PanelWithToolbar,
  refreshIcon,
  SidePanel
} from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { AccordionPanel } from '@lumino/widgets';

import { SandboxAPI } from './api';
import { FilesView } from './components/FilesView';
import { SandboxesView } from './components/SandboxesView';
import { SnapshotsView } from './components/SnapshotsView';
import { askSnapshot, confirmDestroy } from './dialogs';
import { TRANSLATION_DOMAIN } from './format';
import { sandboxIcon } from './icons';
import { FilesModel, SandboxesModel } from './model';
import { notifyError } from './notify';
import { DEFAULT_SETTINGS, readSettings, refreshIntervalMs } from './settings';
import { SandboxStatus } from './status';

export const PANEL_ID = 'sandbox-kernel-panel';

namespace CommandIDs {
  export const open = 'sandbox-kernel:open';
  export const refresh = 'sandbox-kernel:refresh';
  export const reveal = 'sandbox-kernel:reveal-current';
  export const destroy = 'sandbox-kernel:destroy-current';
  export const snapshot = 'sandbox-kernel:snapshot-current';
  export const upload = 'sandbox-kernel:upload';
}

/** The side panel; it tells the model when it is seen, so polling stands by while hidden. */
class SandboxSidePanel extends SidePanel {
  constructor(
    readonly model: SandboxesModel,
    translator: ITranslator
  ) {
    super({ translator });
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
  optional: [
    ILayoutRestorer,
    ICommandPalette,
    INotebookTracker,
    IStatusBar,
    ISettingRegistry,
    ITranslator
  ],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null,
    notebooks: INotebookTracker | null,
    statusBar: IStatusBar | null,
    settingRegistry: ISettingRegistry | null,
    translator: ITranslator | null
  ) => {
    translator = translator ?? nullTranslator;
    const trans = translator.load(TRANSLATION_DOMAIN);
    const api = new SandboxAPI(app.serviceManager.serverSettings);
    const model = new SandboxesModel({
      api,
      interval: refreshIntervalMs(DEFAULT_SETTINGS.refreshInterval)
    });
    model.visible = false; // until the panel is shown
    const files = new FilesModel(api, {
      patterns: DEFAULT_SETTINGS.hiddenFiles,
      showHidden: DEFAULT_SETTINGS.showHiddenFiles
    });

    // The user's settings, applied now and on every change (no reload needed).
    if (settingRegistry) {
      const apply = (settings: ISettingRegistry.ISettings) => {
        const values = readSettings(settings.composite);
        model.interval = refreshIntervalMs(values.refreshInterval);
        app.commands.notifyCommandChanged(CommandIDs.refresh);
        files.setHidden({
          patterns: values.hiddenFiles,
          showHidden: values.showHiddenFiles
        });
      };
      settingRegistry
        .load(plugin.id)
        .then(settings => {
          apply(settings);
          settings.changed.connect(apply);
        })
        .catch(reason =>
          console.warn(
            'sandbox-kernel: settings not loaded, defaults used',
            reason
          )
        );
    }

    const panel = new SandboxSidePanel(model, translator);
    panel.id = PANEL_ID;
    panel.addClass('jp-SandboxPanel');
    panel.title.icon = sandboxIcon;
    panel.title.caption = trans.__('Sandboxes');

    const browse = (id: string) => {
      const accordion = panel.content as AccordionPanel;
      const index = accordion.widgets.indexOf(filesSection);
      if (index >= 0) {
        accordion.expand(index);
      }
      void files.open(id, '');
    };
    const sandboxesView = new SandboxesView(model, trans, browse);
    const filesView = new FilesView(files, trans);
    const sandboxesSection = section(trans.__('Sandboxes'), sandboxesView);
    const snapshotsSection = section(
      trans.__('Snapshots'),
      new SnapshotsView(model, trans)
    );
    const filesSection = section(trans.__('Files'), filesView);

    app.commands.addCommand(CommandIDs.refresh, {
      label: trans.__('Refresh Sandboxes'),
      caption: () =>
        trans.__(
          'Refresh sandboxes and snapshots now (the panel refreshes by itself every %1 s while shown)',
          model.interval / 1000
        ),
      icon: refreshIcon,
      execute: async () => {
        await model.refresh().catch(() => undefined);
        if (files.sandboxId) {
          await files.reload();
        }
      }
    });

    // One upload control: the Files section's button, disabled (saying why) until a
    // sandbox's files are shown. Dropping files on the list uploads too.
    app.commands.addCommand(CommandIDs.upload, {
      label: trans.__('Upload Files to the Sandbox Folder Shown…'),
      caption: () =>
        files.sandboxId
          ? trans.__(
              'Upload files into %1:/workspace/%2',
              files.sandboxId,
              files.path
            )
          : trans.__(
              'Choose “Browse files” on a sandbox first, then upload into its workspace'
            ),
      icon: fileUploadIcon,
      isEnabled: () => !!files.sandboxId,
      execute: () => filesView.pickFiles()
    });
    files.changed.connect(() =>
      app.commands.notifyCommandChanged(CommandIDs.upload)
    );
    filesSection.toolbar.addItem(
      'upload',
      new CommandToolbarButton({
        commands: app.commands,
        id: CommandIDs.upload,
        label: ''
      })
    );
    panel.toolbar.addItem(
      'refresh',
      new CommandToolbarButton({
        commands: app.commands,
        id: CommandIDs.refresh,
        label: ''
      })
    );
    panel.addWidget(sandboxesSection);
    panel.addWidget(snapshotsSection);
    panel.addWidget(filesSection);
    // Room where the lists are long: sandbox cards and files get more than snapshots.
    // Each section scrolls within its share (style/base.css), at any window height.
    (panel.content as AccordionPanel).setRelativeSizes([2, 1, 2]);

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
      label: trans.__('Show Sandboxes Panel'),
      caption: trans.__('Open the side panel listing your sandboxes'),
      execute: () => app.shell.activateById(PANEL_ID)
    });
    app.commands.addCommand(CommandIDs.reveal, {
      label: trans.__('Reveal Current Notebook’s Sandbox'),
      isEnabled: hasNotebook,
      execute: async () => {
        const sandbox = await currentSandbox();
        app.shell.activateById(PANEL_ID);
        if (sandbox) {
          model.reveal(sandbox.id);
        } else {
          notifyError(
            trans,
            trans.__('Finding the notebook’s sandbox'),
            new Error(
              trans.__(
                'this notebook’s kernel has no sandbox yet (run a cell first)'
              )
            )
          );
        }
      }
    });
    app.commands.addCommand(CommandIDs.destroy, {
      label: trans.__('Destroy Current Notebook’s Sandbox…'),
      isEnabled: hasNotebook,
      execute: async () => {
        const sandbox = await currentSandbox();
        if (!sandbox) {
          notifyError(
            trans,
            trans.__('Destroying the notebook’s sandbox'),
            new Error(trans.__('this notebook’s kernel has no sandbox yet'))
          );
          return;
        }
        await confirmDestroy(trans, model, sandbox);
      }
    });
    app.commands.addCommand(CommandIDs.snapshot, {
      label: trans.__('Snapshot Current Notebook’s Sandbox…'),
      isEnabled: hasNotebook,
      execute: async () => {
        const sandbox = await currentSandbox();
        if (!sandbox) {
          notifyError(
            trans,
            trans.__('Snapshot of the notebook’s sandbox'),
            new Error(trans.__('this notebook’s kernel has no sandbox yet'))
          );
          return;
        }
        await askSnapshot(trans, model, sandbox);
      }
    });
    if (palette) {
      for (const command of Object.values(CommandIDs)) {
        palette.addItem({ command, category: trans.__('Sandboxes') });
      }
    }

    if (statusBar && notebooks) {
      const status = new SandboxStatus(
        model,
        notebooks,
        trans,
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
