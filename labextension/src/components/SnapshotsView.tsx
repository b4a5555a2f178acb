/** The Snapshots section as a lumino widget, drawn again on every change of the model. */
import { TranslationBundle } from '@jupyterlab/translation';
import { ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import * as React from 'react';

import { SandboxesModel } from '../model';
import { SnapshotList } from './SnapshotList';

export class SnapshotsView extends ReactWidget {
  constructor(
    readonly model: SandboxesModel,
    readonly trans: TranslationBundle
  ) {
    super();
    this.addClass('jp-SandboxPanel-snapshots');
    this.addClass('jp-SandboxPanel-body');
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this.model.changed}>
        {() => <SnapshotList model={this.model} trans={this.trans} />}
      </UseSignal>
    );
  }
}
