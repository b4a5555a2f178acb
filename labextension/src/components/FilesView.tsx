/**
 * The Files section as a lumino widget: the chosen sandbox's folder, drawn again on
 * every change of the files model, and the uploads its button and drops start.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import * as React from 'react';

import { FilesModel } from '../model';
import { notifyError } from '../notify';
import { FilesBody } from './FilesBody';

export class FilesView extends ReactWidget {
  constructor(
    readonly files: FilesModel,
    readonly trans: TranslationBundle
  ) {
    super();
    this.addClass('jp-SandboxPanel-files');
    this.addClass('jp-SandboxPanel-body');
  }

  /** Open the system file picker and upload what is chosen (only with a sandbox chosen). */
  pickFiles(): void {
    if (!this.files.sandboxId) {
      return;
    }
    const input = document.createElement('input');
    input.type = 'file';
    input.multiple = true;
    input.onchange = () => {
      if (input.files && input.files.length) {
        this.upload(input.files);
      }
    };
    input.click();
  }

  /** Upload files into the folder shown; a failure shows as a notification. */
  upload(list: FileList | File[]): void {
    this.files
      .upload(Array.from(list))
      .catch(error => notifyError(this.trans, this.trans.__('Upload'), error));
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this.files.changed}>
        {() => (
          <FilesBody
            files={this.files}
            trans={this.trans}
            onUpload={list => this.upload(list)}
          />
        )}
      </UseSignal>
    );
  }
}
