// The dashboard's entry: the page for the current route, behind sign-in.
import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { forgetToken, storedToken, whenUnauthorized } from "./api.ts";
import { AgentPage } from "./AgentPage.tsx";
import { Agents } from "./Agents.tsx";
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
    if (!signedIn && route.page !== "signin") navigate(hrefs.signin(), { replace: true });
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
        <Link href={hrefs.agents()} class={route.page === "agents" || route.page === "agent" ? "on" : ""}>
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

render(<App />, document.getElementById("app")!);
