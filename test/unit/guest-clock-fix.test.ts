// The clock fix after a restore (guest-agent.ts fixGuestClock) against a scripted guest with a skewed clock and a
// link delay: what it measures, how many round trips it takes, and a first answer that needs asking twice.
import { duplexPair } from "node:stream";
import { describe, expect, it } from "vitest";
import { fixGuestClock, formatNs, GuestAgentClient, parseNs } from "../../fleet-agent/drivers/common/guest-agent.ts";

/**
 * A guest agent answering GETTIME and SETTIME; each direction of the link takes `oneWayMs`. `firstSetInMs`: the way
 * in of the first SETTIME takes that long instead (its path cold in a restored guest). `beforeSameNet`: a guest agent
 * older than SETTIME's `same-net` flag, which refuses it as a bad time. `lagMs()`: how far the guest is behind now.
 */
function fakeGuest(opts: { offsetMs: number; oneWayMs: number; dropFirst?: number; beforeSameNet?: boolean; firstSetInMs?: number }) {
  const [host, guest] = duplexPair();
  let offsetNs = BigInt(opts.offsetMs) * 1_000_000n;
  const guestNow = () => BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6)) + offsetNs;
  const seen: string[] = [];
  const lines: string[] = [];
  let dropped = 0;
  let sets = 0;
  let buffer = "";
  guest.setEncoding("utf8");
  guest.on("data", (chunk: string) => {
    buffer += chunk;
    let nl: number;
    while ((nl = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, nl);
      buffer = buffer.slice(nl + 1);
      const [id, command, arg, flag] = line.split(" ");
      seen.push(command!);
      lines.push(line.slice(id!.length + 1));
      if (dropped < (opts.dropFirst ?? 0)) {
        dropped++;
        continue; // not yet running: the request waits in a queue the guest never reads
      }
      if (command === "SETTIME" && flag !== undefined && (opts.beforeSameNet || flag !== "same-net")) {
        setTimeout(() => guest.write(`${id} ERR bad time\n`), 2 * opts.oneWayMs);
        continue;
      }
      const inMs = command === "SETTIME" && sets++ === 0 ? (opts.firstSetInMs ?? opts.oneWayMs) : opts.oneWayMs;
      setTimeout(() => {
        if (command === "SETTIME") offsetNs = parseNs(arg!) - BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6));
        const answer = `${id} OK ${formatNs(guestNow())}\n`;
        setTimeout(() => guest.write(answer), opts.oneWayMs);
      }, inMs);
    }
  });
  return { agent: new GuestAgentClient(host), seen, lines, lagMs: () => -Number(offsetNs) / 1e6 };
}

describe("fixGuestClock", () => {
  it("sets a clock 2 s behind in two round trips and measures what is left from SETTIME's own answer", async () => {
    const { agent, seen } = fakeGuest({ offsetMs: -2000, oneWayMs: 8 });
    const fix = await fixGuestClock(agent, { targetMs: 50 });
    expect(seen).toEqual(["GETTIME", "SETTIME"]);
    expect(fix.skewBeforeMs).toBeGreaterThan(-2030);
    expect(fix.skewBeforeMs).toBeLessThan(-1970);
    // The guest applied a timestamp one link delay old: it is behind by that much, and the fix says so.
    expect(fix.skewAfterMs).toBeLessThan(-3);
    expect(fix.skewAfterMs).toBeGreaterThan(-20);
    agent.close();
  });

  it("tries again while the skew left is over the target", async () => {
    const { agent, seen } = fakeGuest({ offsetMs: 5000, oneWayMs: 30 });
    const fix = await fixGuestClock(agent, { targetMs: 10, attempts: 3 });
    expect(seen).toEqual(["GETTIME", "SETTIME", "SETTIME", "SETTIME"]);
    expect(fix.skewAfterMs).toBeLessThan(-10);
    agent.close();
  });

  it("sets the clock again when the first set's round trip was too long to be sure of what is left", async () => {
    // 60 ms in, 1 ms out: the midpoint estimate says 30 ms behind, the guest is 60 ms behind; the target is 50.
    const { agent, seen, lagMs } = fakeGuest({ offsetMs: -2000, oneWayMs: 1, firstSetInMs: 60 });
    const fix = await fixGuestClock(agent, { targetMs: 50 });
    expect(seen).toEqual(["GETTIME", "SETTIME", "SETTIME"]);
    expect(lagMs()).toBeLessThan(15);
    expect(Math.abs(fix.skewAfterMs)).toBeLessThan(15);
    agent.close();
  });

  it("asks a just-restored guest again until its first answer, within firstAnswerWithinMs", async () => {
    const { agent, seen } = fakeGuest({ offsetMs: -3000, oneWayMs: 5, dropFirst: 1 });
    const started = performance.now();
    const fix = await fixGuestClock(agent, { firstAnswerWithinMs: 3000 });
    expect(performance.now() - started).toBeGreaterThanOrEqual(450); // the first ask waited its 500 ms
    expect(seen).toEqual(["GETTIME", "GETTIME", "SETTIME"]);
    expect(fix.skewBeforeMs).toBeLessThan(-2900);
    expect(Math.abs(fix.skewAfterMs)).toBeLessThan(50);
    agent.close();
  });

  it("gives up when the guest never answers by the deadline", async () => {
    const { agent } = fakeGuest({ offsetMs: 0, oneWayMs: 5, dropFirst: 100 });
    await expect(fixGuestClock(agent, { firstAnswerWithinMs: 700 })).rejects.toThrow(/did not answer GETTIME/);
    agent.close();
  });

  it("tells the guest its network is the one it last saw when asked to, and asks an older guest again without it", async () => {
    const current = fakeGuest({ offsetMs: -2000, oneWayMs: 5 });
    await fixGuestClock(current.agent, { sameNetwork: true });
    expect(current.lines[1]).toMatch(/^SETTIME \d+\.\d{9} same-net$/);
    current.agent.close();
    const plain = fakeGuest({ offsetMs: -2000, oneWayMs: 5 });
    await fixGuestClock(plain.agent);
    expect(plain.lines[1]).toMatch(/^SETTIME \d+\.\d{9}$/); // the guest checks its neighbours
    plain.agent.close();

    const older = fakeGuest({ offsetMs: -2000, oneWayMs: 5, beforeSameNet: true });
    const fix = await fixGuestClock(older.agent, { sameNetwork: true, attempts: 1 });
    expect(older.lines.map((l) => l.replace(/\d+\.\d{9}/, "T"))).toEqual(["GETTIME", "SETTIME T same-net", "SETTIME T"]);
    expect(Math.abs(fix.skewAfterMs)).toBeLessThan(50);
    older.agent.close();
  });
});
