import { describe, expect, it } from 'vitest';

import { copyText, ICopyTarget } from '../src/clipboard';

/** A clipboard that keeps what it is given, or refuses as a browser without permission does. */
function clipboard(refuse = false) {
  const written: string[] = [];
  return {
    written,
    async writeText(text: string) {
      if (refuse) {
        throw new DOMException('Write permission denied.', 'NotAllowedError');
      }
      written.push(text);
    }
  };
}

/**
 * A document whose `copy` command fires the `copy` event at its listeners with a
 * clipboardData (as a browser does in a click), or fails as a browser that refuses it.
 */
function commandDocument(works = true, withData = true) {
  const listeners = new Set<EventListener>();
  const copied: Record<string, string> = {};
  const doc = {
    copied,
    commands: [] as string[],
    addEventListener: (type: string, listener: EventListener) => {
      expect(type).toBe('copy');
      listeners.add(listener);
    },
    removeEventListener: (type: string, listener: EventListener) => {
      listeners.delete(listener);
    },
    execCommand: (command: string) => {
      doc.commands.push(command);
      if (!works) {
        return false;
      }
      const event = {
        clipboardData: withData
          ? {
              setData: (type: string, value: string) => {
                copied[type] = value;
              }
            }
          : null,
        preventDefault: () => undefined
      } as unknown as Event;
      listeners.forEach(listener => listener(event));
      return true;
    },
    get listening() {
      return listeners.size;
    }
  };
  return doc;
}

const DAV = 'http://lab.test/sandbox-kernel/dav/sk-alice/';

describe('copyText', () => {
  it('uses the Clipboard API when it is there', async () => {
    const board = clipboard();
    const doc = commandDocument();
    const target = { clipboard: board, document: doc } as ICopyTarget;
    expect(await copyText(DAV, target)).toBe(true);
    expect(board.written).toEqual([DAV]);
    expect(doc.commands).toEqual([]);
  });

  it('falls back to the copy command when the Clipboard API refuses', async () => {
    const doc = commandDocument();
    const target = { clipboard: clipboard(true), document: doc } as ICopyTarget;
    expect(await copyText(DAV, target)).toBe(true);
    expect(doc.commands).toEqual(['copy']);
    expect(doc.copied).toEqual({ 'text/plain': DAV });
    expect(doc.listening).toBe(0); // its handler is gone after the copy
  });

  it('falls back to the copy command without a Clipboard API (plain http)', async () => {
    const doc = commandDocument();
    expect(
      await copyText(DAV, { clipboard: null, document: doc } as ICopyTarget)
    ).toBe(true);
    expect(doc.copied['text/plain']).toBe(DAV);
  });

  it('says so when neither way works', async () => {
    for (const doc of [commandDocument(false), commandDocument(true, false)]) {
      const target = {
        clipboard: clipboard(true),
        document: doc
      } as ICopyTarget;
      expect(await copyText(DAV, target)).toBe(false);
      expect(doc.listening).toBe(0);
    }
    const throwing = {
      addEventListener: () => undefined,
      removeEventListener: () => undefined,
      execCommand: () => {
        throw new Error('not supported');
      }
    } as unknown as ICopyTarget['document'];
    expect(await copyText(DAV, { document: throwing })).toBe(false);
    // In node there is neither a clipboard nor a document.
    expect(await copyText(DAV)).toBe(false);
  });
});
