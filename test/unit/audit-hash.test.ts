// The audit row encoding the verifier hashes (byte-length prefixes, `~` for null, fixed order) and DATABASE_APP_ROLE's parsing.
import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { auditRowHash, canonicalAuditRow, type AuditHashFields } from "../../schema/audit-hash.ts";
import { parseDatabaseAppRole } from "../../schema/postgres.ts";

const row: AuditHashFields = {
  id: "12",
  seq: "3",
  chain: "ten_a",
  atMicros: "1767225600000001",
  actor: "ü",
  action: "agent.create",
  target: "agt_1",
  requestId: null,
  detailText: '{"a": 1}',
};

describe("audit row hash", () => {
  it("writes each field as <UTF-8 byte length>:<text>, null as ~, after the version tag", () => {
    expect(canonicalAuditRow(row)).toBe('agentvm-audit-v12:121:35:ten_a16:17672256000000012:ü12:agent.create5:agt_1~8:{"a": 1}');
  });

  it("is hex sha256 of the previous hash and the canonical row, so fields cannot slide into each other", async () => {
    expect(await auditRowHash("ab", row)).toBe(
      createHash("sha256")
        .update(`ab${canonicalAuditRow(row)}`)
        .digest("hex"),
    );
    const shifted = { ...row, action: "agent.", target: "createagt_1" };
    expect(await auditRowHash("ab", shifted)).not.toBe(await auditRowHash("ab", row));
    expect(await auditRowHash("ab", { ...row, requestId: "" })).not.toBe(await auditRowHash("ab", row));
  });
});

describe("DATABASE_APP_ROLE", () => {
  it("defaults to agentvm_app, empty turns it off, anything but a plain role name is refused", () => {
    expect(parseDatabaseAppRole({})).toBe("agentvm_app");
    expect(parseDatabaseAppRole({ DATABASE_APP_ROLE: "" })).toBe("");
    expect(parseDatabaseAppRole({ DATABASE_APP_ROLE: " app_ro " })).toBe("app_ro");
    expect(() => parseDatabaseAppRole({ DATABASE_APP_ROLE: 'x"; drop' })).toThrow(/DATABASE_APP_ROLE must be a role name/);
  });
});
