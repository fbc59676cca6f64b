// GuestAgentClient.execKey over an in-memory channel: the line it sends, the answer it takes, an older guest's
// "unknown command" as AppError guest_outdated (409), a malformed key refused before anything is sent.
import { Duplex } from "node:stream";
import { describe, expect, it } from "vitest";
import { GuestAgentClient } from "../../fleet-agent/drivers/common/guest-agent.ts";

/** A guest agent stand-in answering each line with `answer(command, arg)`. */
function fakeGuest(answer: (command: string, arg: string) => string): { client: GuestAgentClient; lines: string[] } {
  const lines: string[] = [];
  const stream: Duplex = new Duplex({
    read() {},
    write(chunk: Buffer, _enc, done) {
      for (const line of chunk.toString().split("\n").filter(Boolean)) {
        lines.push(line);
        const [id, command, arg] = line.split(" ");
        stream.push(`${id} ${answer(command!, arg ?? "")}\n`);
      }
      done();
    },
  });
  return { client: new GuestAgentClient(stream), lines };
}

describe("GuestAgentClient.execKey", () => {
  const key = "ab".repeat(32);

  it("sends EXECKEY <hex64> and takes OK exec/1", async () => {
    const { client, lines } = fakeGuest(() => "OK exec/1");
    await client.execKey(key);
    expect(lines).toEqual([`1 EXECKEY ${key}`]);
  });

  it("a guest built before exec: guest_outdated, saying to restart", async () => {
    const { client } = fakeGuest(() => "ERR unknown command");
    await expect(client.execKey(key)).rejects.toMatchObject({ code: "guest_outdated", message: expect.stringContaining("restart it to update") });
  });

  it("refuses a key that is not 64 lowercase hex without sending it", async () => {
    const { client, lines } = fakeGuest(() => "OK exec/1");
    await expect(client.execKey("AB".repeat(32))).rejects.toMatchObject({ code: "bad_request" });
    await expect(client.execKey("ab")).rejects.toMatchObject({ code: "bad_request" });
    expect(lines).toEqual([]);
  });
});
