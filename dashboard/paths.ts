// The dashboard's client-side routes under /dashboard/ (the server answers index.html for each), and the desktop viewer's /v1/agents/{id}/desktop: which page a path shows, and each page's path.

export const base = "/dashboard";

export type Route =
  | { page: "signin" }
  | { page: "agents" }
  | { page: "agent"; id: string }
  | { page: "desktop"; id: string }
  | { page: "usage" }
  | { page: "pools" }
  | { page: "missing"; path: string };

/** The page a path under /dashboard/ (or the viewer's /v1/agents/{id}/desktop) shows. */
export function routeOf(pathname: string): Route {
  const viewer = /^\/v1\/agents\/([^/]+)\/desktop\/?$/.exec(pathname);
  if (viewer) {
    try {
      return { page: "desktop", id: decodeURIComponent(viewer[1]!) };
    } catch {
      return { page: "missing", path: pathname };
    }
  }
  const rest = pathname.startsWith(base) ? pathname.slice(base.length) : pathname;
  let parts: string[];
  try {
    parts = rest.split("/").filter(Boolean).map(decodeURIComponent);
  } catch {
    return { page: "missing", path: pathname };
  }
  if (parts.length === 0 || (parts.length === 1 && parts[0] === "agents")) return { page: "agents" };
  if (parts.length === 1 && parts[0] === "signin") return { page: "signin" };
  if (parts.length === 1 && parts[0] === "usage") return { page: "usage" };
  if (parts.length === 1 && parts[0] === "pools") return { page: "pools" };
  if (parts.length === 2 && parts[0] === "agents") return { page: "agent", id: parts[1]! };
  if (parts.length === 3 && parts[0] === "agents" && parts[2] === "desktop") return { page: "desktop", id: parts[1]! };
  return { page: "missing", path: pathname };
}

export const hrefs = {
  agents: () => `${base}/`,
  agent: (id: string) => `${base}/agents/${encodeURIComponent(id)}`,
  /** The viewer at the API's own path (the Node gateway serves this page there). */
  desktop: (id: string) => `/v1/agents/${encodeURIComponent(id)}/desktop`,
  usage: () => `${base}/usage`,
  pools: () => `${base}/pools`,
  /** Sign-in, coming back to `next` (a path of the dashboard's or the viewer's) after it. */
  signin: (next?: string) => (next && comesBackTo(next) ? `${base}/signin?next=${encodeURIComponent(next)}` : `${base}/signin`),
};

/** Whether sign-in sends the browser on to `path` after it: a page of the dashboard's or the viewer's (never elsewhere), other than the agents it goes to anyway. */
function comesBackTo(path: string): boolean {
  const route = routeOf(path);
  if (route.page === "missing" || route.page === "signin" || route.page === "agents") return false;
  return route.page === "desktop" || path.startsWith(`${base}/`);
}
