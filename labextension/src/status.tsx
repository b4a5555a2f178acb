/** Status bar item: which sandbox the current notebook's kernel uses; a click reveals it. */
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { TranslationBundle } from '@jupyterlab/translation';
import { ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import { ISignal, Signal } from '@lumino/signaling';
import * as React from 'react';

import { stateLabel } from './format';
import { sandboxIcon } from './icons';
import { SandboxesModel } from './model';

export class SandboxStatus extends ReactWidget {
  constructor(
    readonly model: SandboxesModel,
    readonly notebooks: INotebookTracker,
    readonly trans: TranslationBundle,
    readonly onReveal: () => void
  ) {
    super();
    this.addClass('jp-SandboxStatus');
    notebooks.currentChanged.connect(this._watch, this);
    this._watch();
    model.changed.connect(() => this._changed.emit(), this);
  }

  /** Shown only for a notebook whose kernel is a sandbox kernel. */
  get isRelevant(): boolean {
    const kernel = this.notebooks.currentWidget?.sessionContext.session?.kernel;
    if (!kernel) {
      return false;
    }
    return (
      kernel.name.startsWith('sandbox') || !!this.model.findByKernel(kernel.id)
    );
  }

  get relevanceChanged(): ISignal<this, void> {
    return this._changed;
  }

  /** Follow the current notebook's kernel; ask the server once it has a sandbox. */
  private _watch(): void {
    const panel: NotebookPanel | null = this.notebooks.currentWidget;
    if (panel === this._panel) {
      return;
    }
    if (this._panel) {
      this._panel.sessionContext.kernelChanged.disconnect(this._onKernel, this);
      this._panel.sessionContext.statusChanged.disconnect(this._onStatus, this);
    }
    this._panel = panel;
    if (panel) {
      panel.sessionContext.kernelChanged.connect(this._onKernel, this);
      panel.sessionContext.statusChanged.connect(this._onStatus, this);
    }
    this._onKernel();
  }

  private _onKernel(): void {
    this._changed.emit();
    this._lookup();
  }

  private _onStatus(_: unknown, status: string): void {
    // The sandbox is made by the first cell: look again when a cell ends, until found.
    if (status === 'idle') {
      this._lookup();
    }
  }

  private _lookup(): void {
    const kernel = this._panel?.sessionContext.session?.kernel;
    if (
      !kernel ||
      !this.isRelevant ||
      this.model.findByKernel(kernel.id) ||
      this._pending
    ) {
      return;
    }
    this._pending = true;
    window.setTimeout(() => {
      this._pending = false;
      void this.model.update();
    }, 1000);
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this._changed}>
        {() => {
          const kernelId =
            this.notebooks.currentWidget?.sessionContext.session?.kernel?.id;
          const sandbox = this.model.findByKernel(kernelId);
          const trans = this.trans;
          const label = sandbox ? sandbox.id : trans.__('sandbox: not started');
          return (
            <button
              type="button"
              className="jp-SandboxStatus-button"
              title={
                sandbox
                  ? trans.__(
                      'This notebook runs in sandbox %1 (%2); click to show it',
                      sandbox.id,
                      stateLabel(sandbox.state, trans)
                    )
                  : trans.__(
                      'The sandbox is made by the first cell; click to open the Sandboxes panel'
                    )
              }
              onClick={this.onReveal}
            >
              <sandboxIcon.react tag="span" className="jp-SandboxStatus-icon" />
              {sandbox && (
                <span
                  className={`jp-SandboxPanel-dot jp-SandboxPanel-dot-${sandbox.state}`}
                />
              )}
              <span className="jp-SandboxStatus-label">{label}</span>
            </button>
          );
        }}
      </UseSignal>
    );
  }

  private _panel: NotebookPanel | null = null;
  private _pending = false;
  private _changed = new Signal<this, void>(this);
}
