// The command line's parts without a gateway: tables that fit, cursors followed, durations, configuration order, messages.
import { describe, expect, it } from "vitest";
import { mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { failure, failureMessage } from "../../cli/client.ts";
import { configFile, defaultUrl, resolveConfig, writeConfig } from "../../cli/config.ts";
import { formatDuration, parseDuration } from "../../cli/duration.ts";
import { CliError, exitCodes } from "../../cli/exit.ts";
import { imageName } from "../../cli/image-upload.ts";
import { instantOption, sseData } from "../../cli/logs.ts";
import { followPages } from "../../cli/paging.ts";
import { renderTable } from "../../cli/table.ts";
import { thisMonth } from "../../cli/usage.ts";

describe("tables", () => {
  const columns = [{ header: "ID" }, { header: "NAME", shrink: true }, { header: "N", align: "right" as const }];
  const rows = [
    ["agt_1", "a rather long agent name indeed", "7"],
    ["agt_22", "short", "123"],
  ];

  it("are as wide as their widest cells, numbers right-aligned, nothing cut without a width", () => {
    expect(renderTable(columns, rows)).toBe(
      ["ID      NAME                               N", "agt_1   a rather long agent name indeed    7", "agt_22  short                            123"].join(
        "\n",
      ),
    );
  });

  it("fit a terminal's width by cutting the shrinkable columns with …", () => {
    const out = renderTable(columns, rows, { width: 30 }).split("\n");
    for (const line of out) expect([...line].length).toBeLessThanOrEqual(30);
    expect(out[1]).toBe("agt_1   a rather long ag…    7");
    expect(out[2]).toBe("agt_22  short              123");
  });

  it("never cut ids or numbers, even when the line cannot fit", () => {
    const out = renderTable(columns, rows, { width: 10 }).split("\n");
    expect(out[2]).toMatch(/^agt_22 {2}sho… {2}123$/);
  });

  it("draw a rule under the header when asked", () => {
    expect(renderTable([{ header: "a" }, { header: "bb" }], [["1", "2"]], { rule: true }).split("\n")[1]).toBe("-  --");
  });
});

describe("paging", () => {
  const pages = (all: number[], calls: { cursor: string | undefined; limit: number }[]) => async (cursor: string | undefined, limit: number) => {
    calls.push({ cursor, limit });
    const start = cursor ? Number(cursor) : 0;
    const items = all.slice(start, start + limit);
    return { items, nextCursor: start + limit < all.length ? String(start + limit) : null };
  };
  const all = Array.from({ length: 7 }, (_, i) => i);

  it("follows nextCursor to the last page", async () => {
    const calls: { cursor: string | undefined; limit: number }[] = [];
    const got = await followPages(pages(all, calls), { pageSize: 3 });
    expect(got).toEqual({ items: all, nextCursor: null });
    expect(calls).toEqual([
      { cursor: undefined, limit: 3 },
      { cursor: "3", limit: 3 },
      { cursor: "6", limit: 3 },
    ]);
  });

  it("stops at --limit items, asking for no more than it needs, and gives the cursor to go on", async () => {
    const calls: { cursor: string | undefined; limit: number }[] = [];
    const got = await followPages(pages(all, calls), { pageSize: 3, max: 4 });
    expect(got).toEqual({ items: [0, 1, 2, 3], nextCursor: "4" });
    expect(calls.map((c) => c.limit)).toEqual([3, 1]);
  });

  it("takes a list without cursors as one page, and refuses a cursor that repeats", async () => {
    expect(await followPages(async () => ({ items: [1, 2] }), { pageSize: 100 })).toEqual({ items: [1, 2], nextCursor: null });
    await expect(followPages(async () => ({ items: [1], nextCursor: "same" }), { pageSize: 1 })).rejects.toMatchObject({ exitCode: exitCodes.server });
  });
});

describe("durations", () => {
  it("read 30s, 5m, 1h30m, 250ms and bare seconds; refuse anything else as a usage error", () => {
    expect([
      parseDuration("30s", "x"),
      parseDuration("5m", "x"),
      parseDuration("1h30m", "x"),
      parseDuration("250ms", "x"),
      parseDuration("45", "x"),
      parseDuration("1.5s", "x"),
    ]).toEqual([30_000, 300_000, 5_400_000, 250, 45_000, 1500]);
    for (const bad of ["", "5 minutes", "m5", "5x", "1h 30m"])
      expect(() => parseDuration(bad, "--ttl")).toThrow(expect.objectContaining({ exitCode: exitCodes.usage }));
  });

  it("print at the scale a person reads", () => {
    expect([formatDuration(850), formatDuration(3400), formatDuration(125_000), formatDuration(3_780_000)]).toEqual([
      "850 ms",
      "3.4 s",
      "2 min 5 s",
      "1 h 3 min",
    ]);
  });

  it("--since 1h is an hour before now; an instant passes as written", () => {
    const now = () => Date.UTC(2026, 2, 1, 12);
    expect(instantOption("1h", now)).toBe("2026-03-01T11:00:00.000Z");
    expect(instantOption("2026-02-01T00:00:00Z", now)).toBe("2026-02-01T00:00:00Z");
  });
});

describe("configuration", () => {
  const home = () => mkdtempSync(join(tmpdir(), "agentvm-cli-home-"));

  it("takes flags over AGENTVM_URL/AGENTVM_TOKEN over the config file over the default", () => {
    const dir = home();
    try {
      const env = { HOME: dir };
      expect(resolveConfig({}, env)).toMatchObject({ url: defaultUrl, urlFrom: "the default", token: undefined, pageSize: 100 });
      writeConfig(configFile(env), { url: "http://file:1/", token: "from-file" });
      expect(resolveConfig({}, env)).toMatchObject({ url: "http://file:1", token: "from-file" });
      expect(resolveConfig({}, { ...env, AGENTVM_URL: "http://env:2", AGENTVM_TOKEN: "from-env", AGENTVM_PAGE_SIZE: "7" })).toMatchObject({
        url: "http://env:2",
        urlFrom: "AGENTVM_URL",
        token: "from-env",
        pageSize: 7,
      });
      expect(
        resolveConfig({ url: "http://flag:3", token: "from-flag", pageSize: "2" }, { ...env, AGENTVM_URL: "http://env:2", AGENTVM_TOKEN: "from-env" }),
      ).toMatchObject({ url: "http://flag:3", urlFrom: "--url", token: "from-flag", pageSize: 2 });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("keeps the config file readable by its owner only, under XDG_CONFIG_HOME when set", () => {
    const dir = home();
    try {
      const file = configFile({ HOME: dir, XDG_CONFIG_HOME: join(dir, "xdg") });
      expect(file).toBe(join(dir, "xdg", "agentvm", "config.json"));
      writeConfig(file, { url: "http://127.0.0.1:8080", token: "secret" });
      expect(statSync(file).mode & 0o777).toBe(0o600);
      expect(JSON.parse(readFileSync(file, "utf8"))).toEqual({ url: "http://127.0.0.1:8080", token: "secret" });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("says what is wrong with a bad URL, page size or config file (usage errors)", () => {
    expect(() => resolveConfig({ url: "nope" }, { HOME: "/nonexistent" })).toThrow(/--url: "nope" is not a URL/);
    expect(() => resolveConfig({}, { HOME: "/nonexistent", AGENTVM_PAGE_SIZE: "0" })).toThrow(/AGENTVM_PAGE_SIZE must be a number of items from 1 to 1000/);
  });
});

describe("failures", () => {
  it("print the envelope in one line with its request id; 4xx exit 1, 5xx exit 4", () => {
    const body = { error: { code: "not_found", message: "agent agt_x not found", requestId: "req_abc" } };
    expect(failureMessage(404, body)).toBe("error not_found: agent agt_x not found (request req_abc)");
    expect(failure(404, body).exitCode).toBe(exitCodes.api);
    expect(failure(503, { error: { code: "queue_full", message: "busy", requestId: "req_q" } }).exitCode).toBe(exitCodes.server);
    expect(failureMessage(502, "<html>bad gateway</html>")).toBe("error http_502: <html>bad gateway</html>");
    expect(failure(500, undefined)).toBeInstanceOf(CliError);
  });
});

describe("small readers", () => {
  it("read Server-Sent Events' data, split anywhere, comments skipped", async () => {
    const text = ": keepalive\n\ndata: one\n\ndata: two\r\n\r\ndata: three\n\n";
    const bytes = new TextEncoder().encode(text);
    const body = new ReadableStream<Uint8Array>({
      start(c) {
        for (let i = 0; i < bytes.length; i += 5) c.enqueue(bytes.slice(i, i + 5));
        c.close();
      },
    });
    const lines: string[] = [];
    for await (const line of sseData(body)) lines.push(line);
    expect(lines).toEqual(["one", "two", "three"]);
  });

  it("make image names of --name or the directory's name", () => {
    expect(imageName("node-agent:v2", "x")).toEqual({ name: "node-agent", tag: "v2" });
    expect(imageName("registry/app", "x")).toEqual({ name: "registry/app", tag: "latest" });
    expect(imageName(undefined, "My Agent")).toEqual({ name: "my-agent", tag: "latest" });
    expect(imageName(undefined, "app.tar")).toEqual({ name: "app", tag: "latest" });
    expect(() => imageName("Bad Name", "x")).toThrow(/--name/);
  });

  it("take this month in the zone as usage's default range", () => {
    expect(thisMonth("UTC", Date.UTC(2026, 11, 31, 23))).toEqual({ from: "2026-12-01", to: "2027-01-01" });
    expect(thisMonth("Asia/Tokyo", Date.UTC(2026, 11, 31, 23))).toEqual({ from: "2027-01-01", to: "2027-02-01" });
    expect(() => thisMonth("Mars/Olympus", 0)).toThrow(/not an IANA time zone/);
  });
});
