/**
 * The Sandboxes section as a lumino widget: the list, drawn again on every change of
 * the model, and scrolled to the card the model asks to reveal (which gets the focus).
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import * as React from 'react';

import { SandboxesModel } from '../model';
import { SandboxList } from './SandboxList';

export class SandboxesView extends ReactWidget {
  constructor(
    readonly model: SandboxesModel,
    readonly trans: TranslationBundle,
    readonly onBrowse: (id: string) => void
  ) {
    super();
    this.addClass('jp-SandboxPanel-sandboxes');
    this.addClass('jp-SandboxPanel-body');
    model.revealRequested.connect((_, id) => {
      // After the render the change triggers, so the card is there.
      requestAnimationFrame(() => this.reveal(id));
    });
  }

  /** Scroll a sandbox's card into view and focus it (nothing when it is not listed). */
  reveal(id: string): void {
    const card = Array.from(
      this.node.querySelectorAll<HTMLElement>('[data-sandbox-id]')
    ).find(node => node.dataset.sandboxId === id);
    card?.scrollIntoView({ block: 'nearest' });
    card?.focus();
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this.model.changed}>
        {() => (
          <SandboxList
            model={this.model}
            trans={this.trans}
            onBrowse={this.onBrowse}
          />
        )}
      </UseSignal>
    );
  }
}
