// Navigation between the dashboard's pages without reloads: the current route, navigate(), links.
import type { ComponentChildren } from "preact";
import { useEffect, useState } from "preact/hooks";
import { routeOf, type Route } from "./paths.ts";

export { hrefs } from "./paths.ts";

const listeners = new Set<() => void>();

export function navigate(href: string, opts: { replace?: boolean } = {}): void {
  if (opts.replace) history.replaceState(null, "", href);
  else history.pushState(null, "", href);
  for (const fn of listeners) fn();
}

/** The current route, re-rendered on navigation and on the browser's back and forward. */
export function useRoute(): Route {
  const [path, setPath] = useState(location.pathname);
  useEffect(() => {
    const update = () => setPath(location.pathname);
    listeners.add(update);
    addEventListener("popstate", update);
    return () => {
      listeners.delete(update);
      removeEventListener("popstate", update);
    };
  }, []);
  return routeOf(path);
}

/** A link that navigates without a reload (a modified click still opens a tab). */
export function Link(props: { href: string; class?: string; children: ComponentChildren }) {
  const onClick = (e: MouseEvent) => {
    if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    e.preventDefault();
    navigate(props.href);
  };
  return (
    <a href={props.href} class={props.class} onClick={onClick}>
      {props.children}
    </a>
  );
}
