/**
 * Which names the Files section leaves out, as JupyterLab's file browser does: names
 * starting with a dot (unless hidden files are shown) and the server's default
 * ``hide_globs`` plus ``.ipynb_checkpoints``. Pure functions, unit-tested.
 */

/** Left out of listings by default: jupyter_server's ``hide_globs`` and the checkpoints folder. */
export const DEFAULT_HIDDEN_FILES: ReadonlyArray<string> = [
  '.ipynb_checkpoints',
  '__pycache__',
  '*.pyc',
  '*.pyo',
  '.DS_Store',
  '*~'
];

export interface IHiddenOptions {
  /** Glob patterns (``*``, ``?``, ``[abc]``, ``[!abc]``) matched against the whole name. */
  patterns?: ReadonlyArray<string>;
  /** Show names that start with a dot (those the patterns name stay hidden). */
  showHidden?: boolean;
}

/** A glob as fnmatch reads it, as an anchored regular expression. */
export function globToRegExp(glob: string): RegExp {
  let out = '';
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i];
    if (c === '*') {
      out += '.*';
    } else if (c === '?') {
      out += '.';
    } else if (c === '[') {
      // As fnmatch: "!" first negates, a "]" first (after any "!") is literal.
      let start = i + 1;
      const negate = glob[start] === '!';
      if (negate) {
        start++;
      }
      const end = glob.indexOf(']', glob[start] === ']' ? start + 1 : start);
      if (end < 0) {
        out += '\\[';
        continue;
      }
      const body = glob.slice(start, end).replace(/[\\\]^]/g, m => `\\${m}`);
      out += `[${negate ? '^' : ''}${body}]`;
      i = end;
    } else {
      out += c.replace(/[.+^${}()|\]\\]/g, m => `\\${m}`);
    }
  }
  return new RegExp(`^${out}$`, 's');
}

/** A test of names: true for a name the Files section leaves out. */
export function hiddenNameFilter(
  options: IHiddenOptions = {}
): (name: string) => boolean {
  const patterns = (options.patterns ?? DEFAULT_HIDDEN_FILES)
    .filter(p => typeof p === 'string' && p !== '')
    .map(globToRegExp);
  const showHidden = options.showHidden ?? false;
  return (name: string) =>
    (!showHidden && name.startsWith('.')) || patterns.some(p => p.test(name));
}
