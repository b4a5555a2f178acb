/**
 * One sandbox in the Sandboxes section: its id and state, its facts, its buttons, the
 * ports it listens on (while it runs) and its WebDAV URL. The card is focusable (the status bar's reveal focuses it) and marked
 * while revealed or while an action on it runs.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { ISandbox } from '../api';
import { stateLabel } from '../format';
import { SandboxesModel } from '../model';
import { Breakable } from './Breakable';
import { DavLink } from './DavLink';
import { SandboxActions } from './SandboxActions';
import { SandboxFacts } from './SandboxFacts';
import { SandboxPorts } from './SandboxPorts';
import { StateDot } from './StateDot';

export function SandboxCard(props: {
  sandbox: ISandbox;
  model: SandboxesModel;
  trans: TranslationBundle;
  onBrowse: (id: string) => void;
}): JSX.Element {
  const { sandbox: s, model, trans } = props;
  const busy = model.isBusy(s.id);
  const state = stateLabel(s.state, trans);
  const classes = ['jp-SandboxPanel-card'];
  if (model.highlighted === s.id) {
    classes.push('jp-SandboxPanel-revealed');
  }
  if (busy) {
    classes.push('jp-mod-busy');
  }
  return (
    <li
      className={classes.join(' ')}
      data-sandbox-id={s.id}
      tabIndex={0}
      aria-label={trans.__('sandbox %1, %2', s.id, state)}
    >
      <div className="jp-SandboxPanel-cardHeader">
        <StateDot state={s.state} label={state} />
        <span className="jp-SandboxPanel-name">
          <Breakable text={s.id} />
        </span>
        <span className="jp-SandboxPanel-state">
          {busy ? trans.__('working…') : state}
        </span>
      </div>
      <SandboxFacts sandbox={s} trans={trans} now={Date.now()} />
      <SandboxActions
        sandbox={s}
        model={model}
        trans={trans}
        onBrowse={props.onBrowse}
      />
      <SandboxPorts
        sandbox={s}
        api={model.api}
        trans={trans}
        visible={model.visible}
      />
      <DavLink id={s.id} url={model.api.davUrl(s.id)} trans={trans} />
    </li>
  );
}
