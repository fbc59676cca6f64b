// A RAM file cached in 4 KiB pages by the small-pages helper: writes through a shared mapping (as QEMU's guest writes)
// dirty 4 KiB each, where a file cached by the kernel's readahead may dirty a whole large folio per write. Measured with
// a real mapping: a C writer maps 64 MiB, touches one byte per MiB, and reads what it dirtied from /proc/self/io.
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildCTool } from "../../lib/node-c-tool.ts";
import { cacheInSmallPages, smallPagesTool } from "../../fleet-agent/drivers/qemu/small-pages.ts";

const MIB = 1 << 20;
const WRITER = `#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
int main(int argc, char **argv) {
  int fd = open(argv[1], O_RDWR);
  size_t size = 64u << 20;
  char *p = mmap(0, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (fd < 0 || p == MAP_FAILED) return 1;
  for (size_t off = 0; off < size; off += 1u << 20) { volatile char c = p[off]; (void)c; }
  for (size_t off = 0; off < size; off += 1u << 20) p[off + 100] = 1;
  char buf[4096]; FILE *f = fopen("/proc/self/io", "r"); size_t n = fread(buf, 1, sizeof buf - 1, f); buf[n] = 0;
  char *w = strstr(buf, "\\nwrite_bytes:"); printf("%s\\n", w ? w + 13 : "?");
  return 0;
}
`;

let dir: string;
let writer: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "small-pages-"));
  const built = buildCTool({ text: WRITER }, "mmap-writer", dir);
  if (!("path" in built)) throw new Error(`the test's writer did not build: ${built.error}`);
  writer = built.path;
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Bytes the writer's 64 one-byte writes dirtied in `file` (a fresh sparse 64 MiB file). */
function dirtiedBy64Writes(file: string): number {
  return Number(execFileSync(writer, [file], { encoding: "utf8" }).trim().split("\n")[0]);
}

describe("small-pages: a RAM file's page cache in 4 KiB pages", () => {
  it("64 one-byte writes through a shared mapping dirty 64 pages of 4 KiB", async () => {
    const tool = smallPagesTool();
    if (!("path" in tool)) throw new Error(`the helper did not build: ${tool.error}`);
    const plain = join(dir, "plain.ram");
    const small = join(dir, "small.ram");
    for (const f of [plain, small]) {
      writeFileSync(f, "");
      truncateSync(f, 64 * MIB);
    }
    await cacheInSmallPages(tool.path, small);
    const withHelper = dirtiedBy64Writes(small);
    const without = dirtiedBy64Writes(plain);
    console.log(`small-pages: 64 writes dirtied ${(withHelper / MIB).toFixed(2)} MiB with the helper, ${(without / MIB).toFixed(2)} MiB without`);
    expect(withHelper).toBe(64 * 4096);
    if (without === 64 * 4096) console.log("small-pages: this kernel caches the file in 4 KiB pages anyway (no large folios here)");
  });

  it("a missing file is an error naming it", async () => {
    const tool = smallPagesTool();
    if (!("path" in tool)) throw new Error(tool.error);
    await expect(cacheInSmallPages(tool.path, join(dir, "nope"))).rejects.toThrow(/nope/);
  });
});
