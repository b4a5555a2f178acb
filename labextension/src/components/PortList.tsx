/**
 * A sandbox's listening ports as its card lists them (see SandboxPorts, which reads
 * them): a link to each port's preview that opens a new tab, a note for a port that
 * listens on loopback only, and the server's note when it serves no previews at all.
 * Each line wraps inside the card; nothing is cut at the default sidebar width.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { launchIcon } from '@jupyterlab/ui-components';
import * as React from 'react';

import { IListeningPort, ISandbox, SandboxAPI } from '../api';

/** What one read of a sandbox's ports gave. */
export interface IPortsRead {
  ports: IListeningPort[];
  /** Whether the server serves previews of them; note says why not. */
  preview: boolean;
  note: string;
}

export function PortList(props: {
  sandbox: ISandbox;
  found: IPortsRead;
  api: SandboxAPI;
  trans: TranslationBundle;
}): JSX.Element {
  const { sandbox: s, found, api, trans } = props;
  return (
    <>
      {!found.preview && (
        <div className="jp-SandboxPanel-sub jp-SandboxPanel-portsNote">
          {found.note || trans.__('This server serves no previews.')}
        </div>
      )}
      {found.ports.length === 0 ? (
        <div className="jp-SandboxPanel-sub jp-SandboxPanel-portsNone">
          {trans.__(
            'Nothing listens on a port yet. Start a web app on 0.0.0.0 and it shows here.'
          )}
        </div>
      ) : (
        <ul
          className="jp-SandboxPanel-portList"
          aria-label={trans.__('Listening ports of %1', s.id)}
        >
          {found.ports.map(p => (
            <li
              key={p.port}
              className="jp-SandboxPanel-port"
              data-port={p.port}
            >
              {p.reachable && found.preview ? (
                <a
                  className="jp-SandboxPanel-portLink"
                  href={api.absolute(p.url)}
                  target="_blank"
                  rel="noopener noreferrer"
                  title={api.absolute(p.url)}
                  aria-label={trans.__(
                    'Open port %1 of %2 in a new tab',
                    p.port,
                    s.id
                  )}
                >
                  <span className="jp-SandboxPanel-portNumber">{p.port}</span>
                  <launchIcon.react
                    tag="span"
                    className="jp-SandboxPanel-portIcon"
                  />
                </a>
              ) : (
                <span className="jp-SandboxPanel-portNumber">{p.port}</span>
              )}
              {!p.reachable && (
                <span className="jp-SandboxPanel-sub jp-SandboxPanel-portLoopback">
                  {trans.__(
                    'listens on %1 only: start it on 0.0.0.0 to preview it',
                    p.address
                  )}
                </span>
              )}
            </li>
          ))}
        </ul>
      )}
    </>
  );
}
