// Billing as a meter's sink in the same process (\`npm start\`, a host writing to the shared database): the ingest the HTTP route calls.
import type { IngestResult, MeterSegment, SegmentSink } from "../contracts/meter.ts";
import type { Clock } from "../lib/clock.ts";
import type { Logger } from "../lib/log.ts";
import type { Metrics } from "../lib/metrics.ts";
import type { Db } from "../schema/db.ts";
import { ingestSegments } from "./ingest.ts";

export function billingSink(db: Db, clock: Clock, log?: Logger, metrics?: Metrics): SegmentSink {
  return {
    ship: (batch: MeterSegment[]): Promise<IngestResult> => ingestSegments(db, batch, clock, { ...(log ? { log } : {}), ...(metrics ? { metrics } : {}) }),
  };
}
