// `agentvm rates [show|set]`: the rate-card versions pricing your tenant, and (operator) a new version of a tenant's or the default card.
import type { Command } from "commander";
import type { components } from "../contracts/api/types.ts";
import { ok } from "./client.ts";
import { contextOf } from "./context.ts";
import { usageError } from "./exit.ts";
import { integer } from "./options.ts";
import { renderTable, terminalWidth, type Column } from "./table.ts";

type Version = components["schemas"]["RateCardVersion"] & { until?: string | null };

/** A version's doze memory price: its own per GiB-second, or `snapshot` (the snapshot rate, per GiB-month). */
const dozeMemoryOf = (v: Version) => (v.dozeGibSecondNanocents === null ? "snapshot" : String(v.dozeGibSecondNanocents));

/**
 * One version's prices on one line:
 * `1000000 n¢/vCPU-s, 100000 n¢/GiB-s, 10000000000 n¢/GiB-month USD; dozing 0 n¢/vCPU-s, memory at the snapshot rate`.
 */
export function pricesOf(v: Version): string {
  const dozeMemory = v.dozeGibSecondNanocents === null ? "memory at the snapshot rate" : `${v.dozeGibSecondNanocents} n¢/GiB-s`;
  return `${v.vcpuSecondNanocents} n¢/vCPU-s, ${v.gibSecondNanocents} n¢/GiB-s, ${v.snapshotGibMonthNanocents} n¢/GiB-month ${v.currency}; dozing ${v.dozeVcpuSecondNanocents} n¢/vCPU-s, ${dozeMemory}`;
}

/** The version in effect now, then a table of versions (newest first) with the instant each applies from. */
export function renderRateCards(current: Version, versions: readonly Version[], width?: number): string {
  const withUntil = versions.some((v) => v.until !== undefined);
  const columns: Column[] = [
    { header: "from" },
    ...(withUntil ? [{ header: "until" }] : []),
    { header: "card" },
    { header: "vCPU-s n¢", align: "right" as const },
    { header: "GiB-s n¢", align: "right" as const },
    { header: "GiB-month n¢", align: "right" as const },
    { header: "doze vCPU-s n¢", align: "right" as const },
    { header: "doze GiB-s n¢", align: "right" as const },
    { header: "cur" },
    { header: "by" },
  ];
  const rows = versions.map((v) => [
    v.effectiveFrom,
    ...(withUntil ? [v.until ?? "(open)"] : []),
    `${v.id}${v.tenantId === null ? " (default)" : ""}${v.id === current.id ? " *" : ""}`,
    String(v.vcpuSecondNanocents),
    String(v.gibSecondNanocents),
    String(v.snapshotGibMonthNanocents),
    String(v.dozeVcpuSecondNanocents),
    dozeMemoryOf(v),
    v.currency,
    v.createdBy ?? "",
  ]);
  return `now: ${current.id}${current.tenantId === null ? " (default card)" : ""} from ${current.effectiveFrom}: ${pricesOf(current)}\n${renderTable(columns, rows, { width, rule: true })}\n(* in effect now; prices in nano-cents, 10⁻⁹ cent)`;
}

const price = integer(0, Number.MAX_SAFE_INTEGER);

export function ratesCommand(program: Command): void {
  const rates = program.command("rates").description("rate-card versions: the prices your tenant pays (show, the default) and new versions (set, operator)");

  rates
    .command("show", { isDefault: true })
    .description("the version pricing you now and every version that priced or will price you; --tenant or --default (operator) for a card's own versions")
    .option("--tenant <id>", "a tenant's own versions (operator scope)")
    .option("--default", "the default card's versions (operator scope)")
    .action(async (o: { tenant?: string; default?: boolean }, cmd: Command) => {
      if (o.tenant !== undefined && o.default) throw usageError("--tenant or --default, not both");
      const ctx = contextOf(cmd);
      const api = ctx.api();
      let current: Version | undefined;
      const listed = await ctx.all(async (cursor, limit) => {
        const query = { limit, ...(cursor ? { cursor } : {}) };
        const page =
          o.tenant !== undefined
            ? ok(await api.GET("/v1/tenants/{id}/rate-cards", { params: { path: { id: o.tenant }, query } }))
            : o.default
              ? ok(await api.GET("/v1/rate-cards/default", { params: { query } }))
              : ok(await api.GET("/v1/rate-cards", { params: { query } }));
        current ??= page.current;
        return { items: page.versions as Version[], nextCursor: page.nextCursor };
      });
      if (ctx.json) return ctx.printJson({ current, versions: listed.items, nextCursor: listed.nextCursor });
      ctx.print(renderRateCards(current as Version, listed.items, terminalWidth()));
    });

  rates
    .command("set")
    .description("add a version of a tenant's card (--tenant) or the default card (--default), from --from (operator scope)")
    .option("--tenant <id>", "the tenant whose card gets the version")
    .option("--default", "the default card (prices tenants without a version of their own)")
    .requiredOption("--vcpu-second <nanocents>", "nano-cents per vCPU-second", price)
    .requiredOption("--gib-second <nanocents>", "nano-cents per GiB-second of memory", price)
    .requiredOption("--snapshot-gib-month <nanocents>", "nano-cents per GiB-month (730 h) of snapshot", price)
    .option("--doze-vcpu-second <nanocents>", "nano-cents per vCPU-second while dozing (default 0)", price)
    .option("--doze-gib-second <nanocents>", "nano-cents per GiB-second of memory while dozing (default: the snapshot rate)", price)
    .option("--currency <code>", "ISO 4217 code (default USD)")
    .option("--from <instant>", "ISO 8601 instant on a UTC quarter hour, like 2026-11-01T00:00:00Z (default: the next quarter hour)")
    .action(
      async (
        o: {
          tenant?: string;
          default?: boolean;
          vcpuSecond: number;
          gibSecond: number;
          snapshotGibMonth: number;
          dozeVcpuSecond?: number;
          dozeGibSecond?: number;
          currency?: string;
          from?: string;
        },
        cmd: Command,
      ) => {
        if ((o.tenant === undefined) === (o.default !== true)) throw usageError("name the card: --tenant <id> or --default");
        const ctx = contextOf(cmd);
        const api = ctx.api();
        const body = {
          vcpuSecondNanocents: o.vcpuSecond,
          gibSecondNanocents: o.gibSecond,
          snapshotGibMonthNanocents: o.snapshotGibMonth,
          ...(o.dozeVcpuSecond !== undefined ? { dozeVcpuSecondNanocents: o.dozeVcpuSecond } : {}),
          ...(o.dozeGibSecond !== undefined ? { dozeGibSecondNanocents: o.dozeGibSecond } : {}),
          ...(o.currency !== undefined ? { currency: o.currency } : {}),
          ...(o.from !== undefined ? { effectiveFrom: o.from } : {}),
        };
        const v =
          o.tenant !== undefined
            ? ok(await api.POST("/v1/tenants/{id}/rate-cards", { params: { path: { id: o.tenant } }, body }))
            : ok(await api.POST("/v1/rate-cards/default", { body }));
        if (ctx.json) return ctx.printJson(v);
        ctx.print(`${v.id}: ${o.tenant !== undefined ? `tenant ${o.tenant}` : "the default card"} from ${v.effectiveFrom}: ${pricesOf(v)}`);
      },
    );
}
