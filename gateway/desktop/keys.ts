// The keys a desktop `key` action may press: names as the API takes them (case-insensitive, a few aliases) mapped to X keysyms for xdotool.
//
// Runtime-free. A combination is names joined by `+` (`ctrl+shift+t`); every part must be known here, so a typo is a
// 400 naming it rather than a key xdotool silently ignores.

const modifiers: Record<string, string> = {
  ctrl: "ctrl",
  control: "ctrl",
  alt: "alt",
  shift: "shift",
  super: "super",
  meta: "super",
  cmd: "super",
  win: "super",
};

const named: Record<string, string> = {
  return: "Return",
  enter: "Return",
  escape: "Escape",
  esc: "Escape",
  tab: "Tab",
  backspace: "BackSpace",
  delete: "Delete",
  del: "Delete",
  insert: "Insert",
  home: "Home",
  end: "End",
  page_up: "Page_Up",
  pageup: "Page_Up",
  pgup: "Page_Up",
  page_down: "Page_Down",
  pagedown: "Page_Down",
  pgdn: "Page_Down",
  up: "Up",
  down: "Down",
  left: "Left",
  right: "Right",
  space: "space",
  menu: "Menu",
  print: "Print",
  pause: "Pause",
  caps_lock: "Caps_Lock",
  num_lock: "Num_Lock",
  scroll_lock: "Scroll_Lock",
  minus: "minus",
  "-": "minus",
  equal: "equal",
  "=": "equal",
  plus: "plus",
  comma: "comma",
  ",": "comma",
  period: "period",
  ".": "period",
  slash: "slash",
  "/": "slash",
  backslash: "backslash",
  "\\": "backslash",
  semicolon: "semicolon",
  ";": "semicolon",
  apostrophe: "apostrophe",
  "'": "apostrophe",
  grave: "grave",
  "`": "grave",
  bracketleft: "bracketleft",
  "[": "bracketleft",
  bracketright: "bracketright",
  "]": "bracketright",
};
for (let n = 1; n <= 24; n++) named[`f${n}`] = `F${n}`;

/** The keysym of one key name, or undefined when it is not one we know. */
function keysym(name: string): string | undefined {
  const lower = name.toLowerCase();
  if (modifiers[lower]) return modifiers[lower];
  if (named[lower]) return named[lower];
  if (/^[a-z0-9]$/i.test(name)) return name; // a letter keeps its case: xdotool presses shift for `A`
  return undefined;
}

/** `ctrl+shift+t` as xdotool's `ctrl+shift+t`, `Enter` as `Return`; a message naming the unknown part when one is not known. */
export function parseKeys(combination: string): { keys: string } | { error: string } {
  const parts = combination === "+" ? ["plus"] : combination.split("+");
  if (parts.length > 6 || parts.some((p) => p === "")) return { error: `keys: ${JSON.stringify(combination)} is not a combination such as ctrl+c` };
  const out: string[] = [];
  for (const p of parts) {
    const k = keysym(p);
    if (!k)
      return { error: `keys: unknown key ${JSON.stringify(p)} (names such as a, F5, enter, escape, tab, backspace, up, pageup, ctrl, alt, shift, super)` };
    out.push(k);
  }
  return { keys: out.join("+") };
}
