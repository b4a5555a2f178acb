/**
 * Copying a line of text to the system clipboard from a click.
 *
 * The asynchronous Clipboard API first; where it is missing (a page served over plain
 * http from another host is not a secure context) or refuses (permission denied), the
 * old `copy` command, as JupyterLab's own Clipboard.copyToSystem does it. The caller
 * learns whether either worked, so it can say "Copied" or ask the user to copy by hand.
 * What it touches is passed in, so it is unit-tested in node.
 */

/** The parts of the page copying uses. */
export interface ICopyTarget {
  clipboard?: { writeText(text: string): Promise<void> } | null;
  document?: Pick<
    Document,
    'addEventListener' | 'removeEventListener' | 'execCommand'
  > | null;
}

function pageTarget(): ICopyTarget {
  return {
    clipboard:
      typeof navigator !== 'undefined' ? (navigator.clipboard ?? null) : null,
    document: typeof document !== 'undefined' ? document : null
  };
}

/** The `copy` command, with a handler that puts `text` on the clipboard it opens. */
function copyByCommand(text: string, doc: ICopyTarget['document']): boolean {
  if (!doc) {
    return false;
  }
  let written = false;
  const onCopy = (event: Event) => {
    const data = (event as ClipboardEvent).clipboardData;
    if (data) {
      data.setData('text/plain', text);
      event.preventDefault();
      written = true;
    }
  };
  doc.addEventListener('copy', onCopy);
  try {
    return doc.execCommand('copy') && written;
  } catch {
    return false;
  } finally {
    doc.removeEventListener('copy', onCopy);
  }
}

/** Put `text` on the clipboard; true when it is there. Call it from a click. */
export async function copyText(
  text: string,
  target: ICopyTarget = pageTarget()
): Promise<boolean> {
  if (target.clipboard) {
    try {
      await target.clipboard.writeText(text);
      return true;
    } catch {
      // refused (no permission, document not focused): the command may still work
    }
  }
  return copyByCommand(text, target.document);
}
