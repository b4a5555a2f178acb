/**
 * The body of the Sandboxes section: the server's error, "Loading…", a line saying how
 * to make a first sandbox, or one card per sandbox.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { SandboxesModel } from '../model';
import { ErrorBanner } from './ErrorBanner';
import { SandboxCard } from './SandboxCard';

export function SandboxList(props: {
  model: SandboxesModel;
  trans: TranslationBundle;
  onBrowse: (id: string) => void;
}): JSX.Element {
  const { model: m, trans } = props;
  if (m.error) {
    return (
      <ErrorBanner
        error={m.error}
        trans={trans}
        hint={trans.__(
          'Retrying with backoff; the list is hidden until it answers.'
        )}
      />
    );
  }
  if (!m.loaded) {
    return <div className="jp-SandboxPanel-empty">{trans.__('Loading…')}</div>;
  }
  if (m.sandboxes.length === 0) {
    return (
      <div className="jp-SandboxPanel-empty">
        {trans.__(
          'No sandboxes. Run a cell in a notebook with the “Python 3 (sandbox)” kernel to make one.'
        )}
      </div>
    );
  }
  return (
    <ul className="jp-SandboxPanel-list" aria-label={trans.__('Sandboxes')}>
      {m.sandboxes.map(s => (
        <SandboxCard
          key={s.id}
          sandbox={s}
          model={m}
          trans={trans}
          onBrowse={props.onBrowse}
        />
      ))}
    </ul>
  );
}
