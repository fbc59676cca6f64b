// The dashboard's entry: the page for the current route, behind sign-in.
import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { forgetToken, storedToken, storeToken, whenUnauthorized } from "./api.ts";
import { AgentPage } from "./AgentPage.tsx";
import { Agents } from "./Agents.tsx";
import { DesktopViewer } from "./DesktopViewer.tsx";
import { Pools } from "./Pools.tsx";
import { hrefs, Link, navigate, useRoute } from "./route.tsx";
import { SignIn } from "./SignIn.tsx";
import { Usage } from "./Usage.tsx";

function App() {
  const route = useRoute();
  const [notice, setNotice] = useState<string | undefined>();
  useEffect(() => {
    whenUnauthorized((message) => {
      setNotice(message);
      navigate(hrefs.signin(), { replace: true });
    });
  }, []);
  const signedIn = storedToken() !== null;
  useEffect(() => {
    if (!signedIn && route.page !== "signin") navigate(hrefs.signin(location.pathname), { replace: true });
  }, [signedIn, route.page]);
  if (route.page === "signin" || !signedIn) return <SignIn notice={notice} />;

  const signOut = () => {
    forgetToken();
    setNotice(undefined);
    navigate(hrefs.signin());
  };
  return (
    <>
      <nav>
        <span class="brand">agentvm</span>
        <Link href={hrefs.agents()} class={route.page === "agents" || route.page === "agent" || route.page === "desktop" ? "on" : ""}>
          Agents
        </Link>
        <Link href={hrefs.pools()} class={route.page === "pools" ? "on" : ""}>
          Pools
        </Link>
        <Link href={hrefs.usage()} class={route.page === "usage" ? "on" : ""}>
          Usage
        </Link>
        <button type="button" class="secondary" onClick={signOut}>
          Sign out
        </button>
      </nav>
      {route.page === "agents" ? <Agents /> : null}
      {route.page === "agent" ? <AgentPage key={route.id} id={route.id} /> : null}
      {route.page === "desktop" ? <DesktopViewer key={route.id} id={route.id} /> : null}
      {route.page === "usage" ? <Usage /> : null}
      {route.page === "pools" ? <Pools /> : null}
      {route.page === "missing" ? (
        <main>
          <h1>Not found</h1>
          <p>
            No page at {route.path}. <Link href={hrefs.agents()}>Agents</Link>
          </p>
        </main>
      ) : null}
    </>
  );
}

// A link may carry a token in its fragment (`#token=…`: a fragment never reaches a server), as the CLI's viewer link
// does: kept as a sign-in is, then taken out of the address bar and the history.
const fromLink = /^#token=(.+)$/.exec(location.hash);
if (fromLink) {
  try {
    storeToken(decodeURIComponent(fromLink[1]!));
  } catch {
    // not a token: sign-in asks for one
  }
  history.replaceState(null, "", location.pathname + location.search);
}

render(<App />, document.getElementById("app")!);
