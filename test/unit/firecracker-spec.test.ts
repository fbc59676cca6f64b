// The Swagger 2.0 validator the firecracker contract tests rely on: it must accept what Firecracker accepts and
// fail on what it refuses (unknown fields, missing required, wrong types, enums, minimums), reading the real spec.
import { afterEach, describe, expect, it, vi } from "vitest";
import { imageDrives } from "../../fleet-agent/drivers/firecracker/image-drives.ts";
import { FirecrackerSpec, firecrackerSpecMissing, loadFirecrackerSpec } from "../helpers/firecracker-spec.ts";

const specMissing = firecrackerSpecMissing("test/unit/firecracker-spec.test.ts");
const spec = (specMissing ? undefined : loadFirecrackerSpec()) as FirecrackerSpec; // read only by the tests that run

describe.skipIf(specMissing)("firecracker.yaml validator", () => {
  it("reads the shared spec and resolves operations, including templated paths", () => {
    expect(spec.version).toMatch(/^\d+\.\d+\.\d+/);
    expect(spec.operation("PUT", "/drives/rootfs")).toMatchObject({ operationId: "putGuestDriveByID", pathParams: { drive_id: "rootfs" } });
    expect(spec.operation("PATCH", "/vm")?.operationId).toBe("patchVm");
    expect(spec.operation("GET", "/")?.operationId).toBe("describeInstance");
    expect(spec.operation("DELETE", "/vm")).toBeUndefined();
    expect(spec.operation("PUT", "/drives")).toBeUndefined();
  });

  it("accepts the bodies the driver sends", () => {
    expect(spec.validateRequest("PUT", "/machine-config", { vcpu_count: 2, mem_size_mib: 256, smt: false, track_dirty_pages: true })).toEqual([]);
    expect(
      spec.validateRequest("PUT", "/snapshot/load", {
        snapshot_path: "/s",
        mem_backend: { backend_type: "File", backend_path: "/m" },
        resume_vm: true,
        clock_realtime: true,
        network_overrides: [{ iface_id: "eth0", host_dev_name: "fcvm1" }],
      }),
    ).toEqual([]);
    expect(spec.validateRequest("PUT", "/actions", { action_type: "InstanceStart" })).toEqual([]);
  });

  it("accepts a built image's three drives, each on its own /drives/{drive_id}, none of them the root device", () => {
    const drives = imageDrives({ image: "/images/rootfs.ext4", disk: "/vm/disk.ext4", launch: "/vm/launch.ext4" });
    expect(drives.map((d) => [d.drive_id, d.is_read_only, d.is_root_device])).toEqual([
      ["image", true, false],
      ["disk", false, false],
      ["launch", true, false],
    ]);
    for (const d of drives) {
      expect(spec.operation("PUT", `/drives/${d.drive_id}`)).toMatchObject({ operationId: "putGuestDriveByID", pathParams: { drive_id: d.drive_id } });
      expect(spec.validateRequest("PUT", `/drives/${d.drive_id}`, d)).toEqual([]);
    }
    // The validator would see a drive the API refuses.
    expect(spec.validateRequest("PUT", "/drives/disk", { drive_id: "disk", path_on_host: "/d" })).toEqual(['body: missing required property "is_root_device"']);
    expect(spec.validateRequest("PUT", "/drives/disk", { ...drives[1], read_only: true })).toEqual(['body: unknown property "read_only"']);
  });

  it("fails unknown properties, also inside $ref'd and array items", () => {
    expect(spec.validateRequest("PUT", "/boot-source", { kernel_image_path: "/k", kernel_args: "x" })).toEqual(['body: unknown property "kernel_args"']);
    expect(spec.validateRequest("PUT", "/snapshot/load", { snapshot_path: "/s", mem_backend: { backend_type: "File", backend_path: "/m", extra: 1 } })).toEqual(
      ['body.mem_backend: unknown property "extra"'],
    );
    expect(spec.validateRequest("PUT", "/snapshot/load", { snapshot_path: "/s", network_overrides: [{ iface_id: "eth0" }] })).toEqual([
      'body.network_overrides[0]: missing required property "host_dev_name"',
    ]);
  });

  it("fails missing required properties, wrong types, enums and minimum/maximum", () => {
    expect(spec.validateRequest("PUT", "/machine-config", { vcpu_count: 1 })).toEqual(['body: missing required property "mem_size_mib"']);
    expect(spec.validateRequest("PUT", "/machine-config", { vcpu_count: 1.5, mem_size_mib: "256" })).toEqual([
      "body.vcpu_count: expected integer, got number 1.5",
      'body.mem_size_mib: expected integer, got string "256"',
    ]);
    expect(spec.validateRequest("PUT", "/machine-config", { vcpu_count: 0, mem_size_mib: 128 })).toEqual(["body.vcpu_count: 0 is below the minimum 1"]);
    expect(spec.validateRequest("PUT", "/machine-config", { vcpu_count: 33, mem_size_mib: 128 })).toEqual(["body.vcpu_count: 33 is above the maximum 32"]);
    expect(spec.validateRequest("PATCH", "/vm", { state: "Stopped" })).toEqual(['body.state: "Stopped" is not one of "Paused", "Resumed"']);
    expect(spec.validateRequest("PUT", "/vsock", { guest_cid: 2, uds_path: "/v" })).toEqual(["body.guest_cid: 2 is below the minimum 3"]);
    expect(spec.validateRequest("PUT", "/actions", undefined)).toEqual(["createSyncAction: body is required"]);
    expect(spec.validateRequest("PUT", "/actions", [])).toEqual(["body: expected object, got array"]);
  });
});

describe("firecracker.yaml validator without the shared spec", () => {
  afterEach(() => {
    vi.unstubAllEnvs();
    vi.restoreAllMocks();
  });

  it("honours additionalProperties: true and schema-valued additionalProperties", () => {
    const s = new FirecrackerSpec({
      swagger: "2.0",
      info: { version: "t" },
      paths: {},
      definitions: {
        Free: { type: "object", additionalProperties: true },
        Tags: { type: "object", properties: { name: { type: "string" } }, additionalProperties: { type: "string" } },
      },
    });
    expect(s.validate({ $ref: "#/definitions/Free" }, { anything: [1, 2] }, "x")).toEqual([]);
    expect(s.validate({ $ref: "#/definitions/Tags" }, { name: "a", extra: "b" }, "x")).toEqual([]);
    expect(s.validate({ $ref: "#/definitions/Tags" }, { extra: 3 }, "x")).toEqual(["x.extra: expected string, got number 3"]);
  });

  it("loading a missing spec file is a clear error", () => {
    expect(() => loadFirecrackerSpec("/nonexistent/firecracker.yaml")).toThrow(/Firecracker API spec not found at \/nonexistent\/firecracker\.yaml/);
  });

  it("a missing spec skips the contract tests with one line saying why, and fails them under CI=true", () => {
    vi.stubEnv("FIRECRACKER_SPEC", "/nonexistent/firecracker.yaml");
    vi.stubEnv("CI", "");
    const warn = vi.spyOn(console, "warn").mockImplementation(() => {});
    expect(firecrackerSpecMissing("some.test.ts")).toMatch(/^Firecracker API spec not found at \/nonexistent\/firecracker\.yaml/);
    expect(warn).toHaveBeenCalledTimes(1);
    expect(warn.mock.calls[0]![0]).toMatch(/^some\.test\.ts: skipped: Firecracker API spec not found/);
    vi.stubEnv("CI", "true");
    expect(() => firecrackerSpecMissing("some.test.ts")).toThrow(/some\.test\.ts: Firecracker API spec not found at \/nonexistent\/firecracker\.yaml.*CI=true/);
  });
});
