// Sign-in: a token pasted here is checked against the API and kept in this tab's sessionStorage.
import { useState } from "preact/hooks";
import { checkToken, storeToken } from "./api.ts";
import { hrefs, navigate } from "./route.tsx";

export function SignIn(props: { notice?: string }) {
  const [token, setToken] = useState("");
  const [error, setError] = useState<string | undefined>(props.notice);
  const [busy, setBusy] = useState(false);

  const submit = async (e: Event) => {
    e.preventDefault();
    const t = token.trim();
    if (t === "") return setError("Paste a token (npm start prints one; npm run token mints others).");
    setBusy(true);
    const refused = await checkToken(t);
    setBusy(false);
    if (refused) return setError(refused.message);
    storeToken(t);
    // Back to the page that sent here (a viewer's link), else the agents.
    const next = new URLSearchParams(location.search).get("next");
    navigate(next && hrefs.signin(next) !== hrefs.signin() ? next : hrefs.agents(), { replace: true });
  };

  return (
    <main class="signin">
      <h1>agentvm</h1>
      <form onSubmit={submit}>
        <label for="token">API token</label>
        <textarea
          id="token"
          name="token"
          rows={4}
          spellcheck={false}
          autocomplete="off"
          placeholder="eyJhbGciOi…"
          value={token}
          onInput={(e) => setToken((e.target as HTMLTextAreaElement).value)}
        />
        <button type="submit" disabled={busy}>
          {busy ? "Checking…" : "Sign in"}
        </button>
        {error ? (
          <p class="error" role="alert" data-testid="signin-error">
            {error}
          </p>
        ) : null}
      </form>
      <p class="muted">The token stays in this tab only (sessionStorage) and is sent as a bearer token to this gateway's API.</p>
    </main>
  );
}
