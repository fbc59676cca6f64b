// Headless Chromium for browser tests: Debian's chromium driven by playwright-core, as root with --no-sandbox, background networking off, in a throwaway profile.
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type BrowserContext } from "playwright-core";

/** Where Debian's chromium package puts the browser (scripts/provision.ts installs it). */
export const chromiumPath = "/usr/bin/chromium";

export function hasChromium(): boolean {
  return existsSync(chromiumPath);
}

/** Flags known to work here: no sandbox (root), no GPU, and nothing that reaches out to Google's services. */
const chromiumArgs = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

export interface Browser {
  context: BrowserContext;
  /** Closes the browser and removes its profile directory. */
  close(): Promise<void>;
}

export async function launchChromium(): Promise<Browser> {
  const profile = mkdtempSync(join(tmpdir(), "agentvm-chromium-"));
  try {
    const context = await chromium.launchPersistentContext(profile, {
      executablePath: chromiumPath,
      headless: true,
      args: chromiumArgs,
      viewport: { width: 1280, height: 900 },
    });
    return {
      context,
      async close() {
        await context.close();
        rmSync(profile, { recursive: true, force: true });
      },
    };
  } catch (err) {
    rmSync(profile, { recursive: true, force: true });
    throw err;
  }
}
