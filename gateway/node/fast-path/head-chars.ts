// The character rule both head parsers of the fast path apply to a whole HTTP head at once (request and response).

// Field values may hold visible ASCII, space, tab and obs-text; no other control character anywhere in a head.
const controlRe = /[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]/;

/**
 * Where `head` (without its final CRLF CRLF) breaks the character rule: a control character, or a CR or LF that is
 * not one CRLF; -1 when it does not. A one-class regex and a walk over the line ends (a lookaround regex doing both
 * cost several times more per head).
 */
export function badHeadChar(head: string): number {
  const m = controlRe.exec(head);
  if (m) return m.index;
  for (let i = head.indexOf("\n"); i >= 0; i = head.indexOf("\n", i + 1)) if (i === 0 || head.charCodeAt(i - 1) !== 13) return i;
  for (let i = head.indexOf("\r"); i >= 0; i = head.indexOf("\r", i + 1)) if (head.charCodeAt(i + 1) !== 10) return i;
  return -1;
}
