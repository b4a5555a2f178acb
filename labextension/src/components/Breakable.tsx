/**
 * Text that may wrap where a path, URL or image name reads best split: after a run of
 * "/", ":", "@" or "_" that follows something else (never after a leading "/"); the
 * CSS's overflow-wrap still splits a part too long for the line. It adds only <wbr>
 * elements, so the text and a copy of it stay exactly the same.
 */
import * as React from 'react';

/** The text in parts, each but the last ending with a run of separators. */
export function breakParts(text: string): string[] {
  return text.split(/(?<=[^/:@_][/:@_]+)(?![/:@_])/);
}

export function Breakable(props: { text: string }): JSX.Element {
  return (
    <>
      {breakParts(props.text).map((part, i) => (
        <React.Fragment key={i}>
          {i > 0 && <wbr />}
          {part}
        </React.Fragment>
      ))}
    </>
  );
}
