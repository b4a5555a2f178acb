/**
 * A sandbox's WebDAV URL (the whole workspace as a drive), a button copying it and a
 * one-line mount hint, at the foot of its card (after the actions, so Tab from the
 * card still reaches Stop/Start first). The URL wraps inside its own box at the
 * card's full width, after its slashes where it can, so all of it is read at any panel
 * width; one click on it selects it whole. When neither clipboard path works the URL
 * is selected instead, for the keyboard's copy.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import { checkIcon, copyIcon } from '@jupyterlab/ui-components';
import * as React from 'react';

import { copyText } from '../clipboard';
import { ActionButton } from './ActionButton';
import { Breakable } from './Breakable';

/** How long "Copied" stays shown after a click (a failure's words three times as long). */
export const COPIED_MS = 2500;

export function DavLink(props: {
  /** The sandbox's id, named by the copy button. */
  id: string;
  url: string;
  trans: TranslationBundle;
}): JSX.Element {
  const { id, url, trans } = props;
  // A new object per click, so a second click shows its confirmation for full time.
  const [copied, setCopied] = React.useState<{ ok: boolean } | null>(null);
  const urlNode = React.useRef<HTMLElement>(null);
  React.useEffect(() => {
    if (!copied) {
      return;
    }
    const timer = window.setTimeout(
      () => setCopied(null),
      copied.ok ? COPIED_MS : 3 * COPIED_MS
    );
    return () => window.clearTimeout(timer);
  }, [copied]);
  const copy = () => {
    void copyText(url).then(ok => {
      setCopied({ ok });
      if (!ok && urlNode.current) {
        window.getSelection()?.selectAllChildren(urlNode.current);
      }
    });
  };
  return (
    <div className="jp-SandboxPanel-dav">
      <div className="jp-SandboxPanel-davHead">
        <span className="jp-SandboxPanel-davLabel">{trans.__('WebDAV')}</span>
        <span
          className={`jp-SandboxPanel-davStatus${copied ? ' jp-mod-copied' : ''}`}
          role="status"
        >
          {copied
            ? copied.ok
              ? trans.__('Copied')
              : trans.__('No clipboard access: copy the selected URL by hand')
            : ''}
        </span>
        <ActionButton
          icon={copied?.ok ? checkIcon : copyIcon}
          label={trans.__('Copy the WebDAV URL of %1', id)}
          className="jp-SandboxPanel-copy"
          onClick={copy}
        />
      </div>
      <code className="jp-SandboxPanel-davUrl" title={url} ref={urlNode}>
        <Breakable text={url} />
      </code>
      <div className="jp-SandboxPanel-sub jp-SandboxPanel-mountHint">
        {trans.__(
          'Mount it in Finder, Explorer, davfs2 or rclone: any user name, your Jupyter token as password'
        )}
      </div>
    </div>
  );
}
