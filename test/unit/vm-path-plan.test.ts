// `npm start`'s VM path plan: skip for other drivers (nothing probed), use, provision as root on Debian, else one fallback line (or a refusal under DRIVER=qemu).
import { describe, expect, it } from "vitest";
import { planVmPath, type MachineFacts } from "../../scripts/vm-path-plan.ts";
import { prepareVmPath } from "../../scripts/vm-path.ts";

const ready: MachineFacts = { qemu: true, missingPackages: [], root: false, apt: true };
const bare: MachineFacts = { qemu: false, missingPackages: ["qemu-system-x86", "busybox-static"], root: false, apt: true };
const notProbed = (): MachineFacts => {
  throw new Error("probed");
};

describe("planVmPath", () => {
  it("DRIVER=process and DRIVER=firecracker: skip, without probing the machine", () => {
    expect(planVmPath("process", notProbed)).toEqual({ kind: "skip" });
    expect(planVmPath("firecracker", notProbed)).toEqual({ kind: "skip" });
  });

  it("everything installed: use (auto and qemu alike)", () => {
    expect(planVmPath("auto", () => ready)).toEqual({ kind: "use" });
    expect(planVmPath("qemu", () => ({ ...ready, root: true }))).toEqual({ kind: "use" });
  });

  it("root on Debian or Ubuntu: provision exactly the missing packages", () => {
    expect(planVmPath("auto", () => ({ ...bare, root: true }))).toEqual({ kind: "provision", install: ["qemu-system-x86", "busybox-static"] });
    expect(planVmPath("qemu", () => ({ ...ready, missingPackages: ["gcc", "libc6-dev"], root: true }))).toEqual({
      kind: "provision",
      install: ["gcc", "libc6-dev"],
    });
  });

  it("QEMU installed but something else missing and nothing can install it: use (the image build says whether it will do)", () => {
    expect(planVmPath("auto", () => ({ ...ready, missingPackages: ["busybox-static"] }))).toEqual({ kind: "use" });
    expect(planVmPath("auto", () => ({ ...ready, missingPackages: ["busybox-static"], root: true, apt: false }))).toEqual({ kind: "use" });
  });

  it("no QEMU, not root: one fallback line naming the apt-get command", () => {
    const plan = planVmPath("auto", () => bare);
    expect(plan.kind).toBe("fallback");
    const line = (plan as { reason: string }).reason;
    expect(line.split("\n")).toHaveLength(1);
    expect(line).toMatch(/^driver: process \(.*NOT isolated\): qemu-system-x86_64 is missing and installing it needs root; /);
    expect(line).toContain("`sudo apt-get install -y qemu-system-x86 busybox-static`");
    expect(line).toContain("npm start again");
  });

  it("no QEMU, no apt-get (not Debian or Ubuntu), even as root: one fallback line naming what to install", () => {
    const plan = planVmPath("auto", () => ({ ...bare, root: true, apt: false }));
    expect(plan.kind).toBe("fallback");
    const line = (plan as { reason: string }).reason;
    expect(line.split("\n")).toHaveLength(1);
    expect(line).toContain("not Debian or Ubuntu");
    expect(line).toContain("install QEMU (qemu-system-x86_64)");
  });

  it("DRIVER=qemu where QEMU cannot be had: fail with the reason, no fallback", () => {
    const plan = planVmPath("qemu", () => bare);
    expect(plan).toEqual({
      kind: "fail",
      reason: expect.stringMatching(/^DRIVER=qemu but qemu-system-x86_64 is missing and installing it needs root: run `sudo apt-get/),
    });
  });
});

describe("prepareVmPath (the machine stubbed; no apt-get, no image build)", () => {
  const lines: string[] = [];
  const opts = { dataDir: "/nonexistent", say: (line: string) => lines.push(line) };

  it("skip: DRIVER as given, no notice, nothing said", async () => {
    lines.length = 0;
    expect(await prepareVmPath("process", { ...opts, probe: notProbed })).toMatchObject({ driver: "process", plan: { kind: "skip" } });
    expect(lines).toEqual([]);
  });

  it("fallback: the process driver with the plan's one line; nothing installed", async () => {
    let installs = 0;
    const ready = await prepareVmPath("auto", { ...opts, probe: () => bare, install: () => (installs++, true) });
    expect(ready.driver).toBe("process");
    expect(ready.notice).toMatch(/^driver: process .*sudo apt-get install/);
    expect(installs).toBe(0);
  });

  it("provision whose apt-get fails and leaves no QEMU: the process driver with one line (auto), a refusal (DRIVER=qemu)", async () => {
    const installed: string[][] = [];
    const probe = () => ({ ...bare, root: true });
    const auto = await prepareVmPath("auto", { ...opts, probe, install: (p) => (installed.push(p), false) });
    expect(installed).toEqual([["qemu-system-x86", "busybox-static"]]);
    expect(auto.driver).toBe("process");
    expect(auto.notice).toMatch(/^driver: process .*: installing qemu-system-x86, busybox-static with apt-get failed; for real VMs run `npm run setup:vm`/);
    await expect(prepareVmPath("qemu", { ...opts, probe, install: () => false })).rejects.toThrow(/^DRIVER=qemu but installing qemu-system-x86/);
  });

  it("a guest image that cannot be built (a kernel file that is not there): the process driver with one line naming why (auto), a refusal (DRIVER=qemu)", async () => {
    const kernel = { path: "/nonexistent/vmlinuz" };
    const auto = await prepareVmPath("auto", { ...opts, kernel, probe: () => ready });
    expect(auto.driver).toBe("process");
    expect(auto.notice).toMatch(
      /^driver: process .*: the guest image could not be built \(ENOENT.*\/nonexistent\/vmlinuz.*\); for real VMs run `npm run setup:vm`/,
    );
    expect(auto.notice!.split("\n")).toHaveLength(1);
    await expect(prepareVmPath("qemu", { ...opts, kernel, probe: () => ready })).rejects.toThrow(/^DRIVER=qemu but the guest image could not be built/);
  });

  it("DRIVER=qemu that cannot be provisioned: throws the plan's reason", async () => {
    await expect(prepareVmPath("qemu", { ...opts, probe: () => bare })).rejects.toThrow(/^DRIVER=qemu but qemu-system-x86_64 is missing/);
  });
});
