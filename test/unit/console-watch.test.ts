// What the host reads from a booting image VM's console: the init's failure line, the kernel's OOM kill (an agent
// given too little memory loses its entrypoint to it, which otherwise reads as a bare "QEMU exited"), the tail.
import { appendFileSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { ConsoleWatch, outOfMemoryHint } from "../../fleet-agent/drivers/common/image-boot.ts";

const dir = mkdtempSync(join(tmpdir(), "console-watch-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("ConsoleWatch", () => {
  it("tells an OOM kill written after the watch began, not one before; the hint names the process and memMiB", () => {
    const file = join(dir, "console.log");
    writeFileSync(file, "[    1.0] Out of memory: Killed process 7 (old-boot) total-vm:1kB\n");
    const watch = new ConsoleWatch(file);
    expect(watch.outOfMemory()).toBeUndefined();
    expect(outOfMemoryHint(watch, 64)).toBe("");
    appendFileSync(file, "agentvm: entrypoint started\n[    9.1] python3 invoked oom-killer: gfp_mask=0x140cca\n");
    appendFileSync(file, "[    9.2] Out of memory: Killed process 812 (python3) total-vm:45012kB, anon-rss:30100kB, file-rss:0kB\n");
    appendFileSync(file, "agentvm: entrypoint exited with status 137\n");
    expect(watch.failure()).toBe("entrypoint exited with status 137");
    expect(watch.outOfMemory()).toBe("python3 (pid 812)");
    expect(outOfMemoryHint(watch, 64)).toBe(
      "the guest ran out of memory with memMiB 64: its kernel killed python3 (pid 812); create the agent with a larger memMiB. ",
    );
    expect(watch.tail()).toContain("entrypoint exited with status 137");
  });
});
