/**
 * What jsdom lacks and JupyterLab's packages or the panel use, for the component tests
 * (test/components/, run in jsdom); in the node environment of the other tests it does
 * nothing. Each is the smallest stand-in for a browser API jsdom does not implement.
 */
if (typeof window !== 'undefined') {
  // @lumino/dragdrop subclasses DragEvent when it is imported.
  if (typeof window.DragEvent === 'undefined') {
    class DragEvent extends MouseEvent {
      readonly dataTransfer: DataTransfer | null;
      constructor(type: string, init: DragEventInit = {}) {
        super(type, init);
        this.dataTransfer = init.dataTransfer ?? null;
      }
    }
    (globalThis as any).DragEvent = DragEvent;
  }
  // @jupyter/web-components asks for the user's colour scheme when it is imported.
  if (typeof window.matchMedia !== 'function') {
    window.matchMedia = (query: string) =>
      ({
        matches: false,
        media: query,
        onchange: null,
        addListener: () => undefined,
        removeListener: () => undefined,
        addEventListener: () => undefined,
        removeEventListener: () => undefined,
        dispatchEvent: () => false
      }) as MediaQueryList;
  }
  // ReactWidget renders in the browser's idle time.
  if (typeof window.requestIdleCallback !== 'function') {
    window.requestIdleCallback = (callback: IdleRequestCallback) =>
      window.setTimeout(() =>
        callback({ didTimeout: false, timeRemaining: () => 50 })
      );
    window.cancelIdleCallback = (handle: number) => window.clearTimeout(handle);
  }
  // jsdom lays nothing out, so there is nothing to scroll; revealing a card scrolls it.
  if (typeof Element.prototype.scrollIntoView !== 'function') {
    Element.prototype.scrollIntoView = () => undefined;
  }
}
