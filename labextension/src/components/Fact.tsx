/** One line of a sandbox card's facts: a label and its value (a dt and dd of the card's list). */
import * as React from 'react';

export function Fact(props: {
  label: string;
  /** The class of the value, so tests and styles can find it. */
  className?: string;
  /** A tooltip with more than the value says (never needed to read the value itself). */
  title?: string;
  children: React.ReactNode;
}): JSX.Element {
  return (
    <>
      <dt>{props.label}</dt>
      <dd className={props.className} title={props.title}>
        {props.children}
      </dd>
    </>
  );
}
