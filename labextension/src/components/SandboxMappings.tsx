/**
 * The administrator's folders mapped into a sandbox, as its card lists them: one line
 * each, where the sandbox sees it, from which host folder (or volume), and whether it
 * is read-only or writable (a writable one is shared by every sandbox it is mapped
 * into, which the tooltip says). Paths wrap after their slashes inside the card, so at
 * the default sidebar width every mapping is read whole.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { IVolumeMapping } from '../api';
import { Breakable } from './Breakable';

export function SandboxMappings(props: {
  volumes: IVolumeMapping[];
  trans: TranslationBundle;
}): JSX.Element {
  const { volumes, trans } = props;
  return (
    <ul className="jp-SandboxPanel-mappings">
      {volumes.map(v => (
        <li
          key={v.target}
          className="jp-SandboxPanel-mapping"
          data-mode={v.mode}
          title={
            v.mode === 'rw'
              ? trans.__(
                  '%1 shows %2; every sandbox it is mapped into writes it',
                  v.target,
                  v.source
                )
              : trans.__('%1 shows %2, read-only', v.target, v.source)
          }
        >
          <Breakable text={v.target} />
          {' ← '}
          <Breakable text={v.source} />
          {' · '}
          <span className="jp-SandboxPanel-mappingMode">
            {v.mode === 'rw' ? trans.__('writable') : trans.__('read-only')}
          </span>
        </li>
      ))}
    </ul>
  );
}
