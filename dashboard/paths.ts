// The dashboard's client-side routes under /dashboard/ (the server answers index.html for each): which page a path shows, and each page's path.

export const base = "/dashboard";

export type Route =
  | { page: "signin" }
  | { page: "agents" }
  | { page: "agent"; id: string }
  | { page: "usage" }
  | { page: "pools" }
  | { page: "missing"; path: string };

/** The page a path under /dashboard/ shows. */
export function routeOf(pathname: string): Route {
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
  return { page: "missing", path: pathname };
}

export const hrefs = {
  agents: () => `${base}/`,
  agent: (id: string) => `${base}/agents/${encodeURIComponent(id)}`,
  usage: () => `${base}/usage`,
  pools: () => `${base}/pools`,
  signin: () => `${base}/signin`,
};
