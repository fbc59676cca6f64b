// The host's metering, in one import: meter, spool, shipper and the two sinks.
export { Meter, defaultHeartbeatMs, type MeterOptions, type MeterShipping } from "./meter.ts";
export { SegmentSpool, meterDir, type LastEnded, type SegmentLog, type SpoolOptions } from "./spool.ts";
export { Shipper, type SegmentSink, type ShipResult, type ShipperOptions, type ShipperStats } from "./shipper.ts";
export { HttpSink, type HttpSinkOptions } from "./sinks.ts";
export {
  segmentId,
  segmentStartReasons,
  segmentEndReasons,
  type IngestResult,
  type MeterSegment,
  type SegmentEndReason,
  type SegmentStartReason,
} from "../../contracts/meter.ts";
