// The API's types, generated from contracts/api/openapi.json by `npm run openapi` (openapi-typescript): do not edit.

export type paths = {
  "/healthz": {
    /** Liveness: the process answers (wakes nothing, needs no database) */
    get: operations["health"];
  };
  "/readyz": {
    /** Readiness: names each dependency up or down */
    get: operations["ready"];
  };
  "/v1/agents": {
    /** List the tenant's agents, oldest first, a page at a time */
    get: operations["listAgents"];
    /** Create an agent (it sleeps until its first call) */
    post: operations["createAgent"];
  };
  "/v1/agents/{id}": {
    /** An agent, with its live state */
    get: operations["getAgent"];
    /** Delete an agent (its VM is removed from its host) */
    delete: operations["deleteAgent"];
    /** Change what may change on a live agent: idle timeouts, non-waking rules (null = defaults), limits (null = global), egress (while it sleeps) */
    patch: operations["updateAgent"];
  };
  "/v1/agents/{id}/hibernate": {
    /** Hibernate an agent now */
    post: operations["hibernateAgent"];
  };
  "/v1/agents/{id}/wake": {
    /** Wake an agent now */
    post: operations["wakeAgent"];
  };
  "/v1/agents/{id}/leases": {
    /** Keep an agent awake for a while (a lease), waking it */
    post: operations["addAgentLease"];
  };
  "/v1/agents/{id}/leases/{leaseId}": {
    /** End a lease before it expires */
    delete: operations["dropAgentLease"];
  };
  "/v1/agents/{id}/events": {
    /** An agent's VM event log (state transitions with reasons and timings), newest first, a page at a time */
    get: operations["listAgentEvents"];
  };
  "/v1/agents/{id}/checkpoints": {
    /** The agent's checkpoints, oldest first, a page at a time */
    get: operations["listCheckpoints"];
    /** Keep a checkpoint of the agent: an immutable copy of its memory and disk (an awake agent pauses for it) */
    post: operations["createCheckpoint"];
  };
  "/v1/agents/{id}/checkpoints/{checkpointId}": {
    /** One of the agent's checkpoints */
    get: operations["getCheckpoint"];
    /** Delete a checkpoint (its files are removed; agents forked from it keep theirs) */
    delete: operations["deleteCheckpoint"];
  };
  "/v1/agents/{id}/restore": {
    /** Roll the agent back to one of its checkpoints: stopped if awake, then hibernated on the checkpoint (its snapshot replaced); the next call wakes it */
    post: operations["restoreAgent"];
  };
  "/v1/agents/{id}/reset": {
    /** Roll a forked agent back to the checkpoint it was forked from (`forkedFrom`): one episode ends, the next starts from the same state; it is woken in the background */
    post: operations["resetAgent"];
  };
  "/v1/pools": {
    /** The tenant's pools, oldest first, with their counts */
    get: operations["listPools"];
    /** Create a warm pool: `size` hibernated forks of a checkpoint kept ready to hand out, reset to it when given back */
    post: operations["createPool"];
  };
  "/v1/pools/{id}": {
    /** One pool, with how many of its agents are ready, in use and being made ready */
    get: operations["getPool"];
    /** Delete a pool: its agents that are not handed out are deleted; handed-out ones stay with their holders as ordinary agents */
    delete: operations["deletePool"];
    /** Change a pool's size and maxSize: a larger pool is topped up at once; a smaller one deletes its surplus ready agents (never handed-out ones) */
    patch: operations["resizePool"];
  };
  "/v1/pools/{id}/acquire": {
    /**
     * Hand out one of the pool's agents (never the same one to two callers), woken in the background; one is forked now when none is ready and the pool is below maxSize
     * @description At maxSize with none ready but some being made ready (forked by the top-up, reset after a release), it waits for one of them up to `waitMs` (default 10 s). `409 pool_exhausted` when every agent is handed out (at once), or none became ready in time (with `Retry-After`).
     */
    post: operations["acquirePoolAgent"];
  };
  "/v1/pools/{id}/release": {
    /** Give a handed-out agent back: reset to the pool's checkpoint (hibernated on it) and ready for the next acquire */
    post: operations["releasePoolAgent"];
  };
  "/v1/agents/{id}/logs": {
    /**
     * An agent's log (console + workload output): its tail, and with follow what it writes next; never wakes the agent
     * @description Plain text, or Server-Sent Events (one `data:` event per line, keep-alive comments while following) when `Accept: text/event-stream`.
     */
    get: operations["getAgentLogs"];
  };
  "/v1/audit": {
    /**
     * The caller's tenant's audit log, newest first, a page at a time
     * @description Admin actions, wakes, hibernations and webhook deliveries, each with who, what, when and the request id; every entry carries its hash chain links (`seq`, `hash`, `prevHash`).
     */
    get: operations["listAudit"];
  };
  "/v1/audit/verify": {
    /** Recompute the audit hash chains and name the first broken row of each (operator) */
    get: operations["verifyAudit"];
  };
  "/v1/templates": {
    /** The warm templates new agents are cloned from, on every live host: ready, building, or failed (operator) */
    get: operations["listTemplates"];
  };
  "/v1/agents/{id}/exec": {
    /**
     * Run a command inside the agent's VM (waking it), or start one in the background
     * @description Runs `cmd` in the agent's root as the image's user (or `user`), with the image's environment plus `env`; the agent stays awake while it runs. `Accept: application/json` (default) waits and answers the exit status with stdout and stderr (each at most 1048576 bytes: beyond it `truncated`). `Accept: application/x-ndjson` streams one JSON object a line as output comes: `{"stdout":…}`, `{"stderr":…}`, `{"error":…}` (it could not start), last `{"exit":{exitCode,signal,timedOut,durationMs}}`. `background: true` answers 201 with the process (see `/processes`).
     */
    post: operations["execInAgent"];
  };
  "/v1/agents/{id}/processes": {
    /** The background processes started in the agent (running and exited), waking it */
    get: operations["listAgentProcesses"];
  };
  "/v1/agents/{id}/processes/{pid}": {
    /** One background process */
    get: operations["getAgentProcess"];
  };
  "/v1/agents/{id}/processes/{pid}/wait": {
    /** Wait for a background process to exit (at most timeoutMs), answering it as it is then */
    post: operations["waitAgentProcess"];
  };
  "/v1/agents/{id}/processes/{pid}/stdin": {
    /** Write to a background process's standard input (and close it with eof) */
    post: operations["writeAgentProcessStdin"];
  };
  "/v1/agents/{id}/processes/{pid}/signal": {
    /** Send a signal to a background process's group */
    post: operations["signalAgentProcess"];
  };
  "/v1/agents/{id}/processes/{pid}/output": {
    /** Read a background process's output from an offset (the VM keeps 16 MiB per stream) */
    get: operations["readAgentProcessOutput"];
  };
  "/v1/agents/{id}/files": {
    /**
     * Read a file (streamed), list a directory, or with Accept: application/x-tar a tree as tar
     * @description A regular file's bytes with `x-file-mode` (octal), `x-file-uid`, `x-file-gid` and `last-modified`; a directory's entries as JSON; with `Accept: application/x-tar` the file or tree as a tar (modes and owners kept). Paths are inside the agent's root: absolute, no `..`; symlinks resolve inside it.
     */
    get: operations["readAgentFile"];
    /**
     * Write a file (streamed; replaced whole, never seen half-written), or with Content-Type: application/x-tar extract a tree under path
     * @description The body is the file's bytes, at most 4294967296 bytes (the agent's own request-body limit does not apply). With `Content-Type: application/x-tar` it is a tar extracted under `path` (made), modes and owners kept; an entry that would leave `path` (`..`, an absolute link) is refused (400) with nothing after it written.
     */
    put: operations["writeAgentFile"];
    /** Delete a file, or with recursive=true a directory and what it holds */
    delete: operations["deleteAgentFile"];
  };
  "/v1/agents/{id}/exec/tty": {
    /**
     * Run a command on a terminal inside the agent's VM, interactively (a WebSocket)
     * @description A WebSocket upgrade (Node gateways; a Worker answers 501), with the bearer token in Authorization (a browser offers the subprotocols `agentvm.tty` and `agentvm.bearer.<token>` instead). The command starts (waking the agent, which stays awake while it runs) before the `101`: a refusal is a plain answer with the error envelope. Then binary messages are the terminal's bytes both ways; text messages are JSON control: in `{"resize":{"rows":n,"cols":n}}`, out `{"error":"…"}` (it could not start) and `{"exit":{"code":n|null,"signal":"HUP"|null,"timedOut":false,"durationMs":n}}` before the close. Close codes: 1000 it exited, 1001 the gateway is going away or the agent is going to sleep, 1008 a bad control message, 1011 an error (the reason is the error envelope, cut to fit). Closing the socket hangs the command up (SIGHUP); one still running 5 s later is killed.
     */
    get: operations["execTtyInAgent"];
  };
  "/v1/agents/{id}/desktop/viewers": {
    /** Who is watching the agent's desktop, and who holds control (through any gateway) */
    get: operations["desktopViewers"];
  };
  "/v1/agents/{id}/desktop/vnc": {
    /**
     * A viewer's WebSocket to the agent's screen (RFB, as noVNC speaks it): view only, or with control=true the keyboard and pointer
     * @description A WebSocket upgrade (Node gateways; a Worker answers 501), the bearer token in Authorization or, from a browser, offered as the subprotocol `agentvm.bearer.<token>` beside `binary` (the one the answer selects). Binary messages are RFB both ways (noVNC's `RFB` class connects to it as it is). The connection wakes the agent and holds it awake while it is open (a keep-awake lease, counted in the agent's `leases`). `control=true` needs `desktop:control` (or `agents:admin`) as well as `agents:exec`, and one holder at a time across gateways (409 while another holds it); while it is held the actions API answers 409. Listed by `GET /v1/agents/{id}/desktop/viewers`. Audited: `agent.desktop.view` when a viewer leaves, `agent.desktop.control` when control is taken and when it is given back (with how long). Closes 1001 when the agent goes to sleep under it or the gateway stops.
     */
    get: operations["desktopVnc"];
  };
  "/v1/agents/{id}/desktop/screenshot": {
    /**
     * The agent's screen as a PNG (waking it: a hibernated desktop comes back as it was)
     * @description The whole display, `scale` times its size (nearest pixel). `x-desktop-width` and `x-desktop-height` give the display's own size, `x-wake` the wake the call caused. `409 no_desktop` for an agent whose image has no desktop.
     */
    get: operations["desktopScreenshot"];
  };
  "/v1/agents/{id}/desktop/actions": {
    /**
     * Act on the agent's screen: move, click, drag, scroll, type, keys, wait (waking it); answers the cursor and the screen after the last action
     * @description At most 50 actions, run in order; coordinates must be on the agent's display and keys known (else 400 before anything runs). The answer has the cursor and, unless `screenshot: false`, the screen after the last action as a base64 PNG. Recorded in the audit log as `agent.desktop.actions` (the actions' types and the number of characters typed, never the text).
     */
    post: operations["desktopActions"];
  };
  "/hooks/{agentId}/{endpointName}": {
    /**
     * A sender delivers a webhook: signed (Standard Webhooks or GitHub), stored durably, then delivered to the agent
     * @description No bearer token: the signature is the credential (`webhook-id`, `webhook-timestamp`, `webhook-signature` for standard endpoints; `X-Hub-Signature-256` and `X-GitHub-Delivery` for github ones). The body is kept byte for byte, whatever its type.
     */
    post: operations["deliverWebhook"];
  };
  "/v1/agents/{id}/webhooks": {
    /** The agent's webhook endpoints, by name (never their secrets) */
    get: operations["listWebhookEndpoints"];
    /** Create a signed webhook endpoint of the agent; the answer is the only one that shows its secret */
    post: operations["createWebhookEndpoint"];
  };
  "/v1/agents/{id}/webhooks/{name}": {
    /** One webhook endpoint */
    get: operations["getWebhookEndpoint"];
    /** Stop accepting deliveries (those already accepted are still delivered) */
    delete: operations["deleteWebhookEndpoint"];
  };
  "/v1/agents/{id}/webhooks/{name}/rotate": {
    /** A new secret; the one it replaces keeps verifying for overlapS seconds */
    post: operations["rotateWebhookSecret"];
  };
  "/v1/agents/{id}/webhooks/{name}/deliveries": {
    /** The endpoint's deliveries, newest first, each with its attempts (bodies: see getWebhookDelivery) */
    get: operations["listWebhookDeliveries"];
  };
  "/v1/webhook-deliveries/{id}": {
    /** One delivery with its attempts, headers and body */
    get: operations["getWebhookDelivery"];
  };
  "/v1/webhook-deliveries/{id}/redeliver": {
    /** Queue the delivery again now with a fresh attempt budget (also after delivery); 409 while an attempt runs */
    post: operations["redeliverWebhook"];
  };
  "/v1/meter-segments": {
    /** Ship meter segments (a host, with its component token of audience billing); idempotent per segment id */
    post: operations["ingestMeterSegments"];
  };
  "/v1/usage": {
    /** Active time, vCPU-ms and MiB-ms of the tenant over [from, to), by agent and/or local hour or day in a zone */
    get: operations["getUsage"];
  };
  "/v1/agents/{id}/runs": {
    /** The agent's awake runs, newest first: what woke it, the wake's timings, what put it to sleep, metered time */
    get: operations["listAgentRuns"];
  };
  "/v1/invoices": {
    /** The tenant's invoices, newest month first; with `month`, that month's invoice */
    get: operations["listInvoices"];
  };
  "/v1/invoices/{id}": {
    /** One invoice with its lines: stored if final, computed now if a draft */
    get: operations["getInvoice"];
  };
  "/v1/invoices/{month}/finalize": {
    /** Freeze the month's invoice (agents:admin): from the month's end + grace; finalizing twice answers the same invoice */
    post: operations["finalizeInvoice"];
  };
  "/v1/tenants/{id}/rate-cards": {
    /** The tenant's own card versions, newest first, and the version pricing it now (operator) */
    get: operations["listTenantRateCardVersions"];
    /** Add a version of the tenant's card (operator): it prices the tenant's usage from `effectiveFrom` until its next version */
    post: operations["addTenantRateCardVersion"];
  };
  "/v1/rate-cards/default": {
    /** The default card's versions, newest first, and the one in effect now (operator) */
    get: operations["listDefaultRateCardVersions"];
    /** Add a version of the default card (operator): it prices every tenant without a version of its own at that time */
    post: operations["addDefaultRateCardVersion"];
  };
  "/v1/rate-cards": {
    /** The card version pricing the caller's tenant now, and every version that priced or will price it (past and scheduled) */
    get: operations["listRateCards"];
  };
  "/v1/rate-card": {
    /** The prices in effect now for the tenant (its card version, or the default card's); see /v1/rate-cards for every version */
    get: operations["getRateCard"];
  };
  "/v1/images": {
    /** The tenant's images, by name then tag */
    get: operations["listImages"];
    /**
     * Build an image from a tar of a build context (Containerfile), or import an OCI / docker save archive
     * @description Waits and answers 201 with the image, or 422 build_failed / 400 bad_archive with the reason. With `Accept: application/x-ndjson` it streams the build's events instead, one JSON object a line: first `{type:"build"}`, then step/log/progress events, last `{type:"image"}` or `{type:"error"}`.
     */
    post: operations["createImage"];
  };
  "/v1/images/builds/{id}": {
    /** A build's status (builds are kept in this process's memory) */
    get: operations["getImageBuild"];
  };
  "/v1/images/builds/{id}/log": {
    /** A build's log as text; with follow=true it streams until the build ends */
    get: operations["getImageBuildLog"];
  };
  "/v1/images/{id}": {
    /** One image */
    get: operations["getImage"];
    /** Delete the tag; the files go when no tag names the digest (409 while a live agent runs the last one) */
    delete: operations["deleteImage"];
  };
  "/v1/tenants": {
    /** List tenants, oldest first, a page at a time (operator) */
    get: operations["listTenants"];
    /** Create a tenant (operator) */
    post: operations["createTenant"];
  };
  "/v1/tenants/{id}": {
    /** A tenant (operator) */
    get: operations["getTenant"];
    /** Delete a tenant: its agents are destroyed, the row is kept as deleted with its usage and invoices (operator; idempotent) */
    delete: operations["deleteTenant"];
  };
  "/v1/tenants/{id}/suspend": {
    /** Suspend a tenant: its tokens and agents get 403 tenant_suspended, its awake agents are hibernated, nothing is deleted (operator; idempotent) */
    post: operations["suspendTenant"];
  };
  "/v1/tenants/{id}/resume": {
    /** Resume a suspended tenant (operator; idempotent) */
    post: operations["resumeTenant"];
  };
  "/v1/hosts": {
    /** List hosts by id, a page at a time, each with its health, load and agents (operator) */
    get: operations["listHosts"];
  };
  "/v1/hosts/{id}": {
    /** A host with its health, load and agents (operator) */
    get: operations["getHost"];
  };
  "/v1/hosts/{id}/drain": {
    /** Drain a host: it takes no new agents, and its agents hibernate and wake on other hosts; answered once marked, the moves follow (operator; idempotent) */
    post: operations["drainHost"];
  };
  "/v1/hosts/{id}/undrain": {
    /** Stop draining a host: it takes new agents again (agents that moved away stay where they are; operator; idempotent) */
    post: operations["undrainHost"];
  };
  "/v1/upstreams": {
    /** The tenant's upstreams by name (header names only) */
    get: operations["listUpstreams"];
    /** Name an outbound endpoint the tenant's agents call through their host (`/u/<name>/…`), with secret headers the agents never see */
    post: operations["createUpstream"];
  };
  "/v1/upstreams/{name}": {
    /** One upstream (header names only) */
    get: operations["getUpstream"];
    /** Delete an upstream: agents' calls to it answer 404 upstream_not_found (its operations are kept) */
    delete: operations["deleteUpstream"];
    /** Change an upstream's base URL and/or replace its whole set of secret headers (hosts see it within their cache's few seconds) */
    patch: operations["updateUpstream"];
  };
  "/v1/agents/{id}/operations": {
    /** The agent's calls through its tenant's upstreams, newest first, a page at a time */
    get: operations["listOperations"];
  };
  "/v1/agents/{id}/operations/{opId}": {
    /** One of the agent's operations, with the response headers it got */
    get: operations["getOperation"];
  };
};

export type webhooks = Record<string, never>;

export type components = {
  schemas: {
    Error: {
      error: {
        /** @enum {string} */
        code: "bad_request" | "invalid_id" | "unauthorized" | "invalid_signature" | "forbidden" | "forbidden_path" | "tenant_not_found" | "tenant_suspended" | "tenant_deleted" | "not_found" | "upstream_not_found" | "method_not_allowed" | "request_timeout" | "conflict" | "replay" | "guest_outdated" | "no_desktop" | "pool_exhausted" | "idempotency_conflict" | "idempotency_in_flight" | "payload_too_large" | "unsupported_media_type" | "headers_too_large" | "unprocessable" | "build_failed" | "bad_archive" | "rate_limited" | "client_gone" | "too_many_connections" | "internal" | "checkpoints_unsupported" | "upstreams_unsupported" | "exec_unsupported" | "bad_gateway" | "host_unavailable" | "wake_failed" | "boot_failed" | "queue_full" | "shutting_down" | "server_busy" | "clock_skew" | "host_draining" | "database_unavailable" | "gateway_timeout";
        message: string;
        /** @example req_V1StGXR8Z5jdHi6B */
        requestId: string;
        details?: unknown;
      };
    };
    Agent: {
      /** @example agt_0123456789abcdef */
      id: string;
      tenantId: string;
      name: string;
      image: string;
      /** @description The built image `image` was pinned to at creation; null for a built-in image */
      imageDigest: string | null;
      vcpus: number;
      memMiB: number;
      diskMiB: number;
      desktop: components["schemas"]["DesktopSize"];
      idleTimeoutMs: number;
      streamIdleMs: number;
      public: boolean;
      allowEgress: boolean;
      nonWaking: components["schemas"]["NonWakingRules"];
      /** @description Whether `nonWaking` are the defaults */
      nonWakingDefault: boolean;
      limits: components["schemas"]["EffectiveLimits"];
      /** @description Where the agent is called: `/a/{id}/` */
      path: string;
      state: components["schemas"]["VmState"];
      /** Format: date-time */
      lastWakeAt: string | null;
      inFlight: number;
      leases: number;
      lastHibernateError: components["schemas"]["HibernateFailure"];
      /** @description The checkpoint it was forked from (`POST /v1/agents {fromCheckpoint}`); null for an agent created fresh */
      forkedFrom: string | null;
      /** @description The warm pool it belongs to (`POST /v1/pools`); null outside any pool */
      pool: ({
        /** @example pol_0123456789abcdef */
        id: string;
        /**
         * @description ready = waits to be handed out; in_use = handed out; resetting = being forked or reset
         * @enum {string}
         */
        state: "ready" | "in_use" | "resetting";
      }) | null;
      /** Format: date-time */
      createdAt: string;
    };
    /** @description A desktop agent's display size (docs/desktop.md); null for an agent without a desktop */
    DesktopSize: {
      width: number;
      height: number;
    } | null;
    /** @description Paths match exactly or by prefix (trailing *), methods exactly, user agents by substring ignoring case */
    NonWakingRules: {
      paths: string[];
      methods: string[];
      userAgents: string[];
    };
    /** @description The proxy limits in force for the agent (its own, else the gateway's) */
    EffectiveLimits: {
      responseTimeoutMs: number;
      proxyIdleTimeoutMs: number;
      maxBodyBytes: number;
    };
    /**
     * @description Its host's live state when the host knows the agent, else the one the database last recorded
     * @enum {string}
     */
    VmState: "creating" | "booting" | "running" | "dozing" | "snapshotting" | "hibernated" | "restoring" | "stopped" | "failed" | "destroyed";
    /** @description The last failed hibernate (a full disk, say) until one succeeds: the agent stays awake meanwhile */
    HibernateFailure: {
      /** @description Wall clock of the failure, ms since the epoch */
      at: number;
      message: string;
      /** @description `ENOSPC` when the snapshot did not fit */
      code?: string;
      neededBytes?: number;
      freeBytes?: number;
      attempts: number;
      /** @description Wall clock before which the idle reaper does not try again, ms since the epoch */
      retryAt: number;
    } | null;
    CreateAgent: {
      /** @description Default "agent" */
      name?: string;
      /** @description A built-in image (default `demo`), `name[:tag]` of a built image (pinned by digest at creation) or `sha256:<digest>` */
      image?: string;
      vcpus?: number;
      /** @description Guest memory, MiB (64 at the least). An image's runtime needs what it needs: one that runs out is killed by the guest kernel, and the boot fails saying so (`boot_failed`: the guest ran out of memory, with the process it killed) */
      memMiB?: number;
      /** @description the agent's persistent disk, MiB */
      diskMiB?: number;
      desktop?: components["schemas"]["DesktopSizeInput"];
      /** @description ms without a call (or a stream moving bytes) before the agent hibernates */
      idleTimeoutMs?: number;
      /** @description an open stream keeps the agent awake only while it moved bytes within this window, ms */
      streamIdleMs?: number;
      /** @description Anyone may call it, without a token (default false) */
      public?: boolean;
      /** @description The agent may open connections out (default false) */
      allowEgress?: boolean;
      /** @description null or absent: the defaults */
      nonWaking?: {
        /**
         * @description At most 100 paths starting with / (a trailing * matches a prefix)
         * @default []
         */
        paths?: string[];
        /**
         * @description At most 100 upper-case HTTP methods
         * @default []
         */
        methods?: string[];
        /**
         * @description At most 100 user-agent substrings of 2–100 printable characters
         * @default []
         */
        userAgents?: string[];
      } | null;
      limits?: components["schemas"]["AgentLimitsInput"];
      /**
       * @description Fork: a checkpoint of the caller's, by id (`ckp_…`) or as `agt_…:name` (an agent's checkpoint by its name). The new agent is its agent's shape (image, vcpus, memMiB and diskMiB must be left out), on the checkpoint's host, hibernated on the checkpoint; its first call wakes it with a fresh identity
       * @example ckp_0123456789abcdef
       */
      fromCheckpoint?: string;
    };
    /** @description The display size of an agent of a desktop image (one built FROM `agentvm/desktop:bookworm`); default 1024x768 for such an image, refused for another */
    DesktopSizeInput: {
      /** @description display width, pixels */
      width: number;
      /** @description display height, pixels */
      height: number;
    };
    /** @description Per-agent proxy limits; null = the gateway's global value */
    AgentLimitsInput: {
      /** @description the agent must send its response headers within this, ms */
      responseTimeoutMs?: number | null;
      /** @description a call, stream or WebSocket moving no bytes for this long is ended, ms */
      proxyIdleTimeoutMs?: number | null;
      /** @description largest request body, bytes (never above the gateway's global limit) */
      maxBodyBytes?: number | null;
    };
    AgentList: {
      agents: components["schemas"]["Agent"][];
      /** @description Pass as `cursor` for the next page; null on the last page */
      nextCursor: string | null;
    };
    UpdateAgent: {
      /** @description ms without a call (or a stream moving bytes) before the agent hibernates */
      idleTimeoutMs?: number;
      /** @description an open stream keeps the agent awake only while it moved bytes within this window, ms */
      streamIdleMs?: number;
      /** @description null resets to the defaults */
      nonWaking?: {
        /**
         * @description At most 100 paths starting with / (a trailing * matches a prefix)
         * @default []
         */
        paths?: string[];
        /**
         * @description At most 100 upper-case HTTP methods
         * @default []
         */
        methods?: string[];
        /**
         * @description At most 100 user-agent substrings of 2–100 printable characters
         * @default []
         */
        userAgents?: string[];
      } | null;
      limits?: components["schemas"]["AgentLimitsInput"];
      /** @description The agent may open connections out: changed only while it is not awake (409 otherwise), taken by its next wake or boot */
      allowEgress?: boolean;
    };
    AgentDeleted: {
      id: string;
      /** @enum {boolean} */
      deleted: true;
    };
    AgentState: {
      id: string;
      state: components["schemas"]["VmState"];
    };
    Wake: {
      id: string;
      /** @enum {string} */
      state: "running";
      /**
       * @description warm = already running; restore = from its snapshot; boot = cold boot
       * @enum {string}
       */
      wake: "warm" | "restore" | "boot";
      runId: string;
      /** @description Millisecond timings (restoreMs, clockFixMs, bootMs, …), and a restore's sleep `tier` (kept, prestarted, files) */
      timings: {
        [key: string]: number | string;
      };
    };
    Lease: {
      leaseId: string;
      agentId: string;
      /** Format: date-time */
      expiresAt: string;
    };
    AddLease: {
      /** @description how long the lease keeps the agent awake, ms */
      ttlMs: number;
    };
    LeaseDropped: {
      leaseId: string;
      /** @enum {boolean} */
      dropped: true;
    };
    AgentEventList: {
      events: components["schemas"]["AgentEvent"][];
      /** @description Pass as `cursor` for the next page; null on the last page */
      nextCursor: string | null;
    };
    AgentEvent: {
      id: number;
      /** Format: date-time */
      at: string;
      hostId: string;
      agentId: string;
      vmId: string;
      runId: string | null;
      fromState: string;
      toState: string;
      /** @description A wake or sleep reason, `cancelled` or `hibernate_failed` */
      reason: string;
      /** @description Millisecond timings (restoreMs, clockFixMs, bootMs, …), and a restore's sleep `tier` (kept, prestarted, files) */
      timings: ({
        [key: string]: number | string;
      }) | null;
      detail: {
        [key: string]: unknown;
      } | null;
    };
    Checkpoint: {
      /** @example ckp_0123456789abcdef */
      id: string;
      agentId: string;
      name: string | null;
      /**
       * @description api = `POST …/checkpoints`; guest = the workload asked from inside its VM
       * @enum {string}
       */
      origin: "api" | "guest";
      /** @description What its files hold; billed as snapshot storage from its creation to its deletion */
      bytes: number;
      /** @description How long the agent was paused for it (0: taken from its snapshot while hibernated) */
      pausedMs: number;
      /** Format: date-time */
      createdAt: string;
    };
    CreateCheckpoint: {
      /**
       * @description Unique among the agent's live checkpoints
       * @example clean
       */
      name?: string;
    };
    CheckpointList: {
      checkpoints: components["schemas"]["Checkpoint"][];
      /** @description Pass as `cursor` for the next page; null on the last page */
      nextCursor: string | null;
    };
    CheckpointDeleted: {
      id: string;
      /** @enum {boolean} */
      deleted: true;
    };
    RestoreAgent: {
      /**
       * @description A checkpoint id (`ckp_…`), or the name of one of this agent's
       * @example clean
       */
      checkpoint: string;
    };
    AgentReset: {
      agent: components["schemas"]["Agent"];
      /** @description The checkpoint it was rolled back to (`forkedFrom`) */
      checkpointId: string;
      /** @description How long the roll-back took, ms (its next call wakes it from the checkpoint) */
      resetMs: number;
    };
    Pool: {
      /** @example pol_0123456789abcdef */
      id: string;
      name: string;
      /** @description The checkpoint its agents are forked from and reset to */
      fromCheckpoint: string;
      /** @description How many ready agents it keeps */
      size: number;
      /** @description How many agents it may hold in all */
      maxSize: number;
      /** @description Agents waiting to be handed out (hibernated) */
      ready: number;
      /** @description Agents handed out */
      inUse: number;
      /** @description Agents being made ready: forked by the top-up, or reset after a release */
      resetting: number;
      /** @enum {string} */
      state: "active" | "deleting";
      /** Format: date-time */
      createdAt: string;
    };
    CreatePool: {
      /** @description Unique among the tenant's live pools (default: the pool's id); its agents are named after it */
      name?: string;
      /**
       * @description The checkpoint every agent of the pool is forked from and reset to: its id (`ckp_…`), or `agt_…:name` (an agent's checkpoint by name)
       * @example ckp_0123456789abcdef
       */
      fromCheckpoint?: string;
      /** @description Instead of `fromCheckpoint`: an agent is created from the image, woken (it boots), checkpointed and hibernated; the pool forks that checkpoint (the agent is kept: deleting it deletes its checkpoint) */
      image?: string;
      /** @description How many ready agents (hibernated forks) the pool keeps */
      size: number;
      /** @description How many agents it may hold in all, handed out or ready (default: `size`, at least 1) */
      maxSize?: number;
    };
    PoolList: {
      pools: components["schemas"]["Pool"][];
    };
    PoolDeleted: {
      id: string;
      /** @enum {boolean} */
      deleted: true;
      /** @description Its agents that were not handed out, deleted with it */
      removed: number;
      /** @description Its handed-out agents, left to their holders (ordinary agents now: delete them when done) */
      leftInUse: number;
    };
    ResizePool: {
      /** @description How many ready agents the pool keeps from now (more: forked at once; fewer: the surplus ready ones deleted) */
      size?: number;
      /** @description How many agents it may hold in all from now (handed-out ones are never taken back) */
      maxSize?: number;
    };
    PoolAcquired: {
      agent: components["schemas"]["Agent"];
      /** @example pol_0123456789abcdef */
      pool: string;
      /** @description true: none was ready, so this one was forked for the call (the pool was below maxSize) */
      forked: boolean;
    };
    PoolReleased: {
      agent: components["schemas"]["Agent"];
      /** @description How long its reset to the pool's checkpoint took, ms */
      resetMs: number;
    };
    ReleasePoolAgent: {
      /** @example agt_0123456789abcdef */
      agentId: string;
    };
    AuditList: {
      entries: components["schemas"]["AuditEntry"][];
      /** @description Pass as `cursor` for the next page; null on the last page */
      nextCursor: string | null;
    };
    AuditEntry: {
      /** @description The row's number in the whole log (all tenants) */
      id: number;
      /** @description Its place in the tenant's hash chain: 1, 2, … without gaps */
      seq: number;
      /** Format: date-time */
      at: string;
      /**
       * @description Who: a token's subject, a host id (`host_…`), `webhook-worker:<id>`, …
       * @example user_42
       */
      actor: string;
      /** @example agent.create */
      action: string;
      /** @example agt_0123456789abcdef */
      target: string;
      /** @description The API request that did it, where there was one */
      requestId: string | null;
      detail: {
        [key: string]: unknown;
      } | null;
      /** @description hex SHA-256 over prevHash and this entry's fields (README: audit log) */
      hash: string;
      /** @description The previous entry's hash; empty for the first */
      prevHash: string;
    };
    AuditVerification: {
      /** @description True when every chain verified */
      ok: boolean;
      chains: ({
          /** @description A tenant id; empty: the rows without a tenant */
          chain: string;
          ok: boolean;
          /** @description Rows verified (before the broken one) */
          rows: number;
          /** @description The first broken row */
          broken?: {
            /** @enum {string} */
            problem: "unchained_row" | "seq_gap" | "prev_hash_mismatch" | "hash_mismatch" | "head_mismatch";
            seq: number | null;
            id: number | null;
            message: string;
          };
        })[];
    };
    TemplateList: {
      templates: components["schemas"]["Template"][];
    };
    Template: {
      /** @description The host that keeps it: a clone is made on the host of its template */
      hostId: string;
      /**
       * @description What it is a template of, hashed (image, memory, vCPUs, egress, hypervisor and guest versions): a change makes a new key, and a new template
       * @example 3f2a9c01d4e5b6a7
       */
      key: string;
      /** @description The agent image (`demo` or a digest) */
      image: string;
      memMiB: number;
      vcpus: number;
      allowEgress: boolean;
      /**
       * @description building: its VM is booting or being checkpointed; ready: new agents of its kind are cloned from it; failed: its last build failed (tried again later)
       * @enum {string}
       */
      state: "building" | "ready" | "failed";
      /**
       * Format: date-time
       * @description When it became ready
       */
      createdAt?: string;
      /** @description Bytes its files hold (ready) */
      bytes?: number;
      /** @description Its VM's cold boot, ms (ready): what a clone saves */
      bootMs?: number;
      /** @description Why its last build failed (failed) */
      error?: string;
    };
    ExecResult: {
      /** @description The exit status; null when a signal ended it */
      exitCode: number | null;
      /**
       * @description The signal that ended it (`KILL`, `TERM`…), or null
       * @example KILL
       */
      signal: string | null;
      /** @description Its timeout killed it (signal `KILL`) */
      timedOut: boolean;
      durationMs: number;
      stdout: string;
      stderr: string;
      /** @description A stream passed 1048576 bytes: the rest was dropped */
      truncated: boolean;
      /** @enum {string} */
      encoding: "utf8" | "base64";
      /** @description Why the command could not be started (exit code 127), or null */
      error: string | null;
    };
    Process: {
      pid: number;
      cmd: string[];
      /** @enum {string} */
      state: "running" | "exited";
      exitCode: number | null;
      signal: string | null;
      /** @description ISO 8601 */
      startedAt: string | null;
      /** @description ISO 8601; null while it runs */
      endedAt: string | null;
      /** @description At its start only: why it could not be started (it exits 127) */
      error?: string;
    };
    ExecRequest: {
      /**
       * @description The argv (the program is looked up in PATH), or a string run by `/bin/sh -c`
       * @example [
       *   "python3",
       *   "-c",
       *   "print(1)"
       * ]
       */
      cmd: string[] | string;
      /**
       * @description Working directory (default: the image's)
       * @example /home/user/notes.txt
       */
      cwd?: string;
      /** @description Variables over the image's own environment */
      env?: {
        [key: string]: string;
      };
      /** @description Run as this user (name, uid or uid:gid); default: the image's user */
      user?: string;
      /** @description The process's standard input (default: none, /dev/null) */
      stdin?: string;
      /**
       * @description How `stdin` is written
       * @default utf8
       * @enum {string}
       */
      stdinEncoding?: "utf8" | "base64";
      /** @description The process group is killed (SIGKILL) after this, ms; default 60000 in the foreground, none in the background; 0 = none */
      timeoutMs?: number;
      /**
       * @description Start it and answer its pid (see /processes)
       * @default false
       */
      background?: boolean;
      /**
       * @description How stdout and stderr are given in the answer
       * @default utf8
       * @enum {string}
       */
      encoding?: "utf8" | "base64";
    };
    ProcessList: {
      processes: components["schemas"]["Process"][];
    };
    ProcessWait: {
      /**
       * @description Answer after this long if it still runs, ms
       * @default 30000
       */
      timeoutMs?: number;
    };
    ProcessStdin: {
      /** @default */
      data?: string;
      /**
       * @default utf8
       * @enum {string}
       */
      encoding?: "utf8" | "base64";
      /**
       * @description Close its stdin after `data`
       * @default false
       */
      eof?: boolean;
    };
    ProcessSignal: {
      /**
       * @default TERM
       * @example TERM
       */
      signal?: ("HUP" | "INT" | "QUIT" | "ILL" | "TRAP" | "ABRT" | "BUS" | "FPE" | "KILL" | "USR1" | "SEGV" | "USR2" | "PIPE" | "ALRM" | "TERM" | "CHLD" | "CONT" | "STOP" | "TSTP") | number;
    };
    ProcessOutput: {
      data: string;
      /** @enum {string} */
      encoding: "utf8" | "base64";
      offset: number;
      nextOffset: number;
      /** @description Bytes the process wrote past what the VM keeps per stream (16 MiB), never readable */
      dropped: number;
      /** @description It exited and everything was read */
      eof: boolean;
    };
    DirListing: {
      path: string;
      entries: components["schemas"]["DirEntry"][];
    };
    DirEntry: {
      name: string;
      /** @enum {string} */
      type: "file" | "dir" | "symlink" | "other";
      size: number;
      /**
       * @description Octal
       * @example 0644
       */
      mode: string;
      uid: number;
      gid: number;
      /** @description ISO 8601 */
      modifiedAt: string | null;
    };
    FileWritten: {
      path: string;
      size: number;
      mode: string;
      uid: number;
      gid: number;
    };
    TarWritten: {
      path: string;
      entries: number;
    };
    DesktopViewers: {
      viewers: ({
          /** @description The session (`dsk_…`) */
          id: string;
          /** @enum {string} */
          mode: "view" | "control";
          /** @description Who (the token's subject) */
          actor: string;
          /** Format: date-time */
          since: string;
        })[];
    };
    DesktopActionsResult: {
      /** @description Where the pointer is after the last action */
      cursor: {
        x: number;
        y: number;
      };
      display: {
        width: number;
        height: number;
      };
      /** @description The screen after the last action as a base64 PNG, taken once nothing was drawn for 50 ms (at most 1 s later); null with `screenshot: false` */
      screenshot: string | null;
      /** @description The batch's time inside the VM, ms (its waits included) */
      durationMs: number;
    };
    DesktopActions: {
      actions: components["schemas"]["DesktopAction"][];
      /** @description Answer the screen after the last action (default true) */
      screenshot?: boolean;
      /** @description The screenshot's scale, 0.1 to 1 (default 1) */
      scale?: number;
    };
    /** @description `move {x, y}`; `click` and `double_click {x?, y?, button?}` (at the cursor without x and y); `drag {startX, startY, x, y, button?}`; `scroll {direction: up|down|left|right, amount?: 1..50, x?, y?}`; `type {text}`; `key {keys}` (a combination such as `ctrl+c`, `enter`, `shift+Tab`); `wait {ms}` (at most 10000). Coordinates are pixels of the agent's display, (0, 0) its top left corner. */
    DesktopAction: {
      /** @enum {string} */
      type: "move";
      x: number;
      y: number;
    } | ({
      /** @enum {string} */
      type: "click" | "double_click";
      x?: number;
      y?: number;
      /** @enum {string} */
      button?: "left" | "middle" | "right";
    }) | ({
      /** @enum {string} */
      type: "drag";
      startX: number;
      startY: number;
      x: number;
      y: number;
      /** @enum {string} */
      button?: "left" | "middle" | "right";
    }) | ({
      /** @enum {string} */
      type: "scroll";
      x?: number;
      y?: number;
      /** @enum {string} */
      direction: "up" | "down" | "left" | "right";
      amount?: number;
    }) | {
      /** @enum {string} */
      type: "type";
      text: string;
    } | {
      /** @enum {string} */
      type: "key";
      keys: string;
    } | {
      /** @enum {string} */
      type: "wait";
      ms: number;
    };
    WebhookAccepted: {
      deliveryId: string;
    };
    WebhookEndpointWithSecret: components["schemas"]["WebhookEndpoint"] & {
      /** @description Shown only in this answer */
      secret: string;
    };
    WebhookEndpoint: {
      id: string;
      agentId: string;
      name: string;
      /**
       * @description operations: the hidden endpoint that delivers an agent's async upstream outcomes (never listed)
       * @enum {string}
       */
      scheme: "standard" | "github" | "operations";
      path: string;
      /** @description Where senders deliver: /hooks/{agentId}/{name} */
      url: string;
      createdAt: string | null;
      rotatedAt: string | null;
      /** @description Until when the secret before the last rotation still verifies; null when only the current one does */
      previousSecretExpiresAt: string | null;
    };
    NewWebhookEndpoint: {
      /**
       * @description The URL segment: deliveries go to /hooks/{agentId}/{name}
       * @example stripe
       */
      name: string;
      /**
       * @description standard: Standard Webhooks signatures; github: X-Hub-Signature-256
       * @enum {string}
       */
      scheme: "standard" | "github";
      /**
       * @description Path (and query) on the agent that deliveries are POSTed to
       * @default /
       * @example /webhooks/stripe
       */
      path?: string;
    };
    WebhookEndpointPage: {
      endpoints: components["schemas"]["WebhookEndpoint"][];
      /** @description Pass as `cursor` for the next page; null on the last page */
      nextCursor: string | null;
    };
    WebhookRotation: {
      /** @description Seconds the secret being replaced keeps verifying (default WEBHOOK_ROTATION_OVERLAP_S) */
      overlapS?: number;
    };
    WebhookDeliveryPage: {
      deliveries: components["schemas"]["WebhookDelivery"][];
      /** @description Pass as `cursor` for the next page; null on the last page */
      nextCursor: string | null;
    };
    WebhookDelivery: {
      id: string;
      endpointId: string;
      agentId: string;
      /** @description The sender's delivery id (webhook-id or X-GitHub-Delivery) */
      externalId: string;
      /** @enum {string} */
      status: "pending" | "in_flight" | "delivered" | "dead";
      receivedAt: string | null;
      requestId: string | null;
      attemptCount: number;
      nextAttemptAt: string | null;
      deliveredAt: string | null;
      deadAt: string | null;
      lastError: string | null;
      bodyBytes: number;
      /** @description Request headers as received (lower-case names, in order), minus hop-by-hop and credential headers */
      headers: [string, string][];
      attempts: components["schemas"]["WebhookAttempt"][];
    };
    WebhookAttempt: {
      id: string;
      attempt: number;
      /** @enum {string} */
      outcome: "in_flight" | "ok" | "http_error" | "error" | "lease_expired";
      statusCode: number | null;
      error: string | null;
      durationMs: number | null;
      startedAt: string | null;
      finishedAt: string | null;
      requestId: string;
    };
    WebhookDeliveryDetail: components["schemas"]["WebhookDelivery"] & {
      /** @description The body's bytes exactly as received */
      bodyBase64: string;
      endpointName: string;
    };
    WebhookRedelivery: {
      deliveryId: string;
      /** @enum {string} */
      status: "pending" | "in_flight" | "delivered" | "dead";
    };
    MeterIngestResult: {
      accepted: string[];
      duplicates: string[];
      rejected: {
          id: string;
          code: string;
          message: string;
        }[];
    };
    /** @description At most 10,000 segments and 16 MiB; each is accepted, a duplicate, or rejected with its own code */
    MeterBatch: {
      segments: Record<string, never>[];
    };
    Usage: {
      tenantId: string;
      /** @description ISO 8601 with the zone's offset */
      from: string;
      to: string;
      timeZone: string;
      groupBy: string[];
      agentId?: string;
      /**
       * @description rollup: 15-minute buckets; raw: segments split by overlap (ranges not on quarter hours)
       * @enum {string}
       */
      source: "rollup" | "raw";
      rows: {
          start: string;
          end: string;
          agentId?: string;
          /** @description By agent: the warm pool the agent belongs to (absent for one in none); a pooled agent is billed as any other */
          poolId?: string;
          /** @description Milliseconds the VM ran (dozing and hibernation are not active time) */
          activeMs: number;
          /** @description vCPU-milliseconds while active */
          vcpuMs: number;
          /** @description MiB-milliseconds of configured memory while active */
          mibMs: number;
          /** @description Milliseconds the VM dozed: vCPUs stopped while every open call waited on an outbound call */
          dozedMs: number;
          /** @description vCPU-milliseconds while dozing (what the doze vCPU price multiplies) */
          dozedVcpuMs: number;
          /** @description MiB-milliseconds of configured memory while dozing */
          dozedMibMs: number;
          /** @description Milliseconds hibernated (no VM, its snapshot held; from the VM event log), summed over agents when not by agent */
          hibernatedMs: number;
        }[];
      totals: {
        /** @description Milliseconds the VM ran (dozing and hibernation are not active time) */
        activeMs: number;
        /** @description vCPU-milliseconds while active */
        vcpuMs: number;
        /** @description MiB-milliseconds of configured memory while active */
        mibMs: number;
        /** @description Milliseconds the VM dozed: vCPUs stopped while every open call waited on an outbound call */
        dozedMs: number;
        /** @description vCPU-milliseconds while dozing (what the doze vCPU price multiplies) */
        dozedVcpuMs: number;
        /** @description MiB-milliseconds of configured memory while dozing */
        dozedMibMs: number;
        /** @description Milliseconds hibernated (no VM, its snapshot held; from the VM event log), summed over agents when not by agent */
        hibernatedMs: number;
      };
    };
    RunPage: {
      agentId: string;
      runs: components["schemas"]["Run"][];
      /** @description Pass as `cursor` for the next page; null on the last page */
      nextCursor: string | null;
    };
    Run: {
      runId: string;
      hostId: string;
      vmId: string;
      wokeAt: string;
      wakeReason: string;
      /** @description restore | boot */
      wakeMode: string;
      timings: components["schemas"]["WakeTimings"];
      sleptAt: string | null;
      sleepReason: string | null;
      awakeMs: number | null;
      /** @description Milliseconds the VM ran (dozing and hibernation are not active time) */
      activeMs: number;
      /** @description vCPU-milliseconds while active */
      vcpuMs: number;
      /** @description MiB-milliseconds of configured memory while active */
      mibMs: number;
      /** @description Milliseconds the VM dozed: vCPUs stopped while every open call waited on an outbound call */
      dozedMs: number;
      /** @description vCPU-milliseconds while dozing (what the doze vCPU price multiplies) */
      dozedVcpuMs: number;
      /** @description MiB-milliseconds of configured memory while dozing */
      dozedMibMs: number;
      segments: number;
      /** @description Ms of the run's segments not billed: time of the agent that another segment (another host's, e.g. after a failover) had already billed; the sums above leave it out */
      overlapMs: number;
      /** @description Calls through upstreams made during the run (operation records) */
      operations: number;
      /** @description Sum over those operations of first byte minus sent: the time the run waited on upstreams (calls without an answer add nothing) */
      upstreamWaitMs: number;
      /** @description Input tokens of those operations, where their completions said */
      inputTokens: number;
      /** @description Output tokens of those operations, where their completions said */
      outputTokens: number;
      /** @description Of the run, how long a desktop viewer was connected (a viewer holds the agent awake; several at once count once) */
      viewerMs: number;
      /** @description Of the run, how long a human held control of the desktop through the viewer */
      controlMs: number;
    };
    /** @description The wake's parts in ms, as the host recorded them, and a restore's sleep tier */
    WakeTimings: {
      queuedMs?: number;
      restoreMs?: number;
      clockFixMs?: number;
      firstByteMs?: number;
      bootMs?: number;
      skewBeforeMs?: number;
      skewAfterMs?: number;
      rollbackMs?: number;
      /**
       * @description a restore's sleep tier: kept (its QEMU, stopped), prestarted (a QEMU waiting for its state), files (a new QEMU)
       * @enum {string}
       */
      tier?: "kept" | "prestarted" | "files";
    };
    InvoicePage: {
      invoices: components["schemas"]["InvoiceSummary"][];
      /** @description Pass as `cursor` for the next page; null on the last page */
      nextCursor: string | null;
    };
    InvoiceSummary: {
      id: string;
      month: string;
      /** @enum {string} */
      status: "draft" | "final";
      /** @description null for a draft (read it for its total) */
      totalCents: number | null;
      currency: string;
    };
    Invoice: {
      id: string;
      tenantId: string;
      month: string;
      timeZone: string;
      periodStart: string;
      periodEnd: string;
      /** @enum {string} */
      status: "draft" | "final";
      /** @description Segments received before this instant are counted */
      cutoffAt: string;
      finalizableAt: string;
      currency: string;
      rates: components["schemas"]["Rates"];
      /** @description Every card version that priced a part of the period, in order (empty on invoices finalized before cards were versioned) */
      rateCards: components["schemas"]["InvoiceRateCard"][];
      lines: ({
          /** @description Lines per agent, resource and card version: vcpu and memory while active, doze_vcpu and doze_memory while dozing (doze memory quoted per GiB-month), snapshot_storage */
          agentId: string;
          /** @enum {string} */
          resource: "vcpu" | "memory" | "doze_vcpu" | "doze_memory" | "snapshot_storage";
          /** @description In `unit`, a decimal string (storage byte-ms exceed 2^53) */
          quantity: string;
          unit: string;
          unitPriceNanocents: number;
          priceUnit: string;
          amountCents: number;
          /** @description The card version that priced the line (one of `rateCards`; null on lines finalized before versions) */
          rateCardId: string | null;
        })[];
      /** @description Per agent with usage in the period: ms active (the vcpu and memory lines), dozed (the doze lines) and hibernated (its snapshot, priced by size on snapshot_storage); empty on invoices finalized before dozing existed */
      time: {
          agentId: string;
          activeMs: number;
          dozedMs: number;
          hibernatedMs: number;
        }[];
      totalCents: number;
      /** @example 0.45 */
      total: string;
      /** @description How compute was metered, and what a host lost before it shipped its meter segments costs (at most its open segment per agent, not charged) */
      metering: string;
    };
    /** @description The card in effect at the period's start */
    Rates: {
      currency: string;
      vcpuSecondNanocents: number;
      gibSecondNanocents: number;
      snapshotGibMonthNanocents: number;
      /** @description Per vCPU-second while dozing (0: dozing vCPUs are free) */
      dozeVcpuSecondNanocents: number;
      /** @description Per GiB-second of memory while dozing; null: the snapshot rate (snapshotGibMonthNanocents per 730 h) */
      dozeGibSecondNanocents: number | null;
    };
    /** @description Prices in nano-cents (10⁻⁹ cent) per priced unit */
    InvoiceRateCard: components["schemas"]["Rates"] & ({
      id: string;
      /** @description null for the default card */
      tenantId: string | null;
      /** @description The instant the version applies from (UTC) */
      effectiveFrom: string;
      /** @description The part of the period it priced: from (in the invoice's zone)… */
      from: string;
      /** @description …to, exclusive */
      to: string;
    });
    /** @description Prices in nano-cents (10⁻⁹ cent) per priced unit */
    RateCardVersion: components["schemas"]["Rates"] & ({
      id: string;
      /** @description null for the default card */
      tenantId: string | null;
      /** @description The instant it applies from (UTC) */
      effectiveFrom: string;
      createdAt: string;
      /** @description The subject of the token that wrote it (null for the seeded default) */
      createdBy: string | null;
    });
    /** @description A new version of a card: it applies from `effectiveFrom` until the card's next version */
    NewRateCardVersion: {
      /**
       * @description ISO 4217 code, 3 upper-case letters (default USD)
       * @default USD
       * @example USD
       */
      currency?: string;
      /** @description Nano-cents (10⁻⁹ cent) per vCPU-second, a non-negative integer */
      vcpuSecondNanocents: number;
      /** @description Nano-cents (10⁻⁹ cent) per GiB-second, a non-negative integer */
      gibSecondNanocents: number;
      /** @description Nano-cents (10⁻⁹ cent) per GiB-month (730 h) of snapshot, a non-negative integer */
      snapshotGibMonthNanocents: number;
      /**
       * @description Nano-cents (10⁻⁹ cent) per vCPU-second while dozing, a non-negative integer
       * @default 0
       */
      dozeVcpuSecondNanocents?: number;
      /**
       * @description Nano-cents per GiB-second of memory while dozing, at most 3427396976 (its GiB-month price, ×2628000, stays below 2^53); null (the default): the snapshot rate
       * @default null
       */
      dozeGibSecondNanocents?: number | null;
      /**
       * @description ISO 8601 instant (Z or an offset) on a UTC quarter hour; default: the next quarter hour at or after now
       * @example 2026-11-01T00:00:00Z
       */
      effectiveFrom?: string;
    };
    RateCardVersionPage: {
      /** @description null: the default card */
      tenantId: string | null;
      current: components["schemas"]["RateCardVersion"];
      /** @description This card's versions, newest first (scheduled ones included) */
      versions: components["schemas"]["RateCardVersion"][];
      /** @description Pass as `cursor` for the next page; null on the last page */
      nextCursor: string | null;
    };
    TenantRateCards: {
      tenantId: string;
      current: components["schemas"]["RateCardVersion"];
      /** @description Every version that priced, prices or will price the tenant (its own, and the default card's before its first), newest first */
      versions: (components["schemas"]["RateCardVersion"] & ({
          /** @description When the next version takes over (null: none scheduled) */
          until: string | null;
        }))[];
      /** @description Pass as `cursor` for the next page; null on the last page */
      nextCursor: string | null;
    };
    /** @description Prices in nano-cents (10⁻⁹ cent) per priced unit */
    RateCard: components["schemas"]["Rates"] & ({
      id: string;
      /** @description null for the default card */
      tenantId: string | null;
      units: {
        vcpuSecondNanocents: string;
        gibSecondNanocents: string;
        snapshotGibMonthNanocents: string;
        dozeVcpuSecondNanocents: string;
        dozeGibSecondNanocents: string;
      };
    });
    ImageBuilt: {
      image: components["schemas"]["Image"];
      build: components["schemas"]["ImageBuild"];
    };
    Image: {
      id: string;
      tenantId: string;
      name: string;
      tag: string;
      /** @description sha256:<hex> of the root filesystem image */
      digest: string;
      sizeBytes: number;
      config: components["schemas"]["ImageConfig"];
      createdAt: string;
    };
    ImageConfig: {
      entrypoint: string[];
      cmd: string[];
      /** @description KEY=value, in order */
      env: string[];
      workdir: string;
      user: string;
      uid: number;
      gid: number;
      /** @description TCP port the agent serves HTTP on inside the VM */
      port: number;
      /** @description Readiness is an answer on this path rather than an open port */
      readyPath?: string;
    };
    ImageBuild: {
      id: string;
      /** @enum {string} */
      kind: "containerfile" | "archive";
      /** @enum {string} */
      status: "running" | "succeeded" | "failed";
      startedAt: string;
      finishedAt: string | null;
      digest: string | null;
      error: {
        code: string;
        message: string;
      } | null;
      /** @description Early events no longer kept (the full log is in the image's build.log) */
      droppedEvents: number;
    };
    ImagePage: {
      images: components["schemas"]["Image"][];
      /** @description Pass as `cursor` for the next page; null on the last page */
      nextCursor: string | null;
    };
    ImageDeleted: {
      id: string;
      /** @enum {boolean} */
      deleted: true;
      filesRemoved: boolean;
    };
    Tenant: {
      id: string;
      name: string;
      timeZone: string;
      status: components["schemas"]["TenantStatus"];
      /** @description What the operator said when suspending or deleting it */
      statusReason: string | null;
      createdAt: string;
      suspendedAt: string | null;
      deletedAt: string | null;
    };
    /** @enum {string} */
    TenantStatus: "active" | "suspended" | "deleted";
    NewTenant: {
      /** @description Default: a new `ten_…` id. Give one to match your identity provider's tenant claim */
      id?: string;
      name: string;
      /** @description Invoices and default reports use it (default UTC) */
      timeZone?: string;
    };
    TenantList: {
      tenants: components["schemas"]["Tenant"][];
      /** @description Pass as `cursor` for the next page; null on the last page */
      nextCursor: string | null;
    };
    TenantSuspended: {
      tenant: components["schemas"]["Tenant"];
      /** @description Agents that were awake and are now hibernated */
      hibernated: string[];
      /** @description Agents whose hibernation failed (they refuse calls all the same); suspend again to retry */
      failed: {
          agentId: string;
          error: string;
        }[];
    };
    TenantStatusChange: {
      /** @description Shown to the tenant's callers in the 403 */
      reason?: string;
    };
    TenantDeleted: {
      tenant: components["schemas"]["Tenant"];
      /** @description Agents destroyed by this call */
      destroyed: string[];
    };
    HostList: {
      hosts: components["schemas"]["Host"][];
      /** @description Pass as `cursor` for the next page; null on the last page */
      nextCursor: string | null;
    };
    Host: {
      id: string;
      /** @description Base URL of the host's ingress; null when it serves only the gateway in its own process */
      url: string | null;
      /** @example qemu */
      driver: string;
      /** @description Live, its clock within the allowed skew, and not draining: it takes new agents */
      healthy: boolean;
      /**
       * @description Why it is not healthy, e.g. `no heartbeat for 42 s`, `clock 612 s ahead`, `draining`; null when healthy
       * @example no heartbeat for 42 s
       */
      why: string | null;
      /** @description Its last heartbeat is within the live window (HOST_LIVE_WINDOW_MS) */
      live: boolean;
      lastHeartbeatAt: string;
      /** @description How long ago its last heartbeat was, by the database's clock, ms */
      heartbeatAgeMs: number;
      startedAt: string;
      /** @description Its clock minus the database's at its last heartbeat, ms (positive: ahead) */
      clockSkewMs: number;
      /** @description Memory it offers awake agents, MiB */
      capacityMiB: number;
      /** @description Memory of its awake agents at its last heartbeat, MiB */
      usedMiB: number;
      /** @description Its awake agents at its last heartbeat */
      awakeAgents: number;
      /** @description Agents placed on it that are not deleted, awake or not */
      agents: number;
      /** @description An operator drained it: it takes no new agents and its agents move to other hosts */
      draining: boolean;
      drainingAt: string | null;
    };
    Upstream: {
      /** @example ups_0123456789abcdef */
      id: string;
      name: string;
      baseUrl: string;
      /** @description The secret headers' names; their values are never shown */
      headerNames: string[];
      /**
       * @description Where an agent calls it, inside its VM
       * @example http://10.0.2.100:3128/u/openai
       */
      url: string;
      /**
       * @description The variable an agent booted after its creation finds that URL in
       * @example AGENTVM_UPSTREAM_OPENAI_URL
       */
      env: string;
      /** Format: date-time */
      createdAt: string;
      /** Format: date-time */
      updatedAt: string;
    };
    NewUpstream: {
      /**
       * @description Unique in the tenant: agents call `http://10.0.2.100:3128/u/<name>/…`
       * @example openai
       */
      name: string;
      /**
       * @description Where calls go: `baseUrl` + the path below `/u/<name>`. https://; http:// only to a loopback or private address literal or localhost. No credentials, query or fragment
       * @example https://api.openai.com/v1
       */
      baseUrl: string;
      /**
       * @description Secret headers `{Name: value}` the host adds to every call (they win over the agent's own of the same name). Stored sealed; never shown again
       * @default {}
       * @example {
       *   "Authorization": "Bearer sk-…"
       * }
       */
      headers?: {
        [key: string]: string;
      };
    };
    UpstreamList: {
      upstreams: components["schemas"]["Upstream"][];
      /** @description Pass as `cursor` for the next page; null on the last page */
      nextCursor: string | null;
    };
    UpstreamPatch: {
      /**
       * @description Where calls go: `baseUrl` + the path below `/u/<name>`. https://; http:// only to a loopback or private address literal or localhost. No credentials, query or fragment
       * @example https://api.openai.com/v1
       */
      baseUrl?: string;
      /**
       * @description Secret headers `{Name: value}` the host adds to every call (they win over the agent's own of the same name). Stored sealed; never shown again
       * @example {
       *   "Authorization": "Bearer sk-…"
       * }
       */
      headers?: {
        [key: string]: string;
      };
    };
    OperationList: {
      operations: components["schemas"]["Operation"][];
      /** @description Pass as `cursor` for the next page; null on the last page */
      nextCursor: string | null;
    };
    Operation: {
      /** @example op_0123456789abcdef */
      id: string;
      agentId: string;
      /** @description The agent's run when the call was made */
      runId: string | null;
      upstream: string;
      method: string;
      /** @description The path and query below the upstream's base URL */
      path: string;
      /** @description sha256 (hex) of the method, path, body, content-type and accept */
      requestHash: string;
      idempotencyKey: string | null;
      /** @enum {string} */
      mode: "sync" | "async";
      /** @enum {string} */
      state: "queued" | "in_flight" | "succeeded" | "failed";
      /** @description The upstream's status (null: no answer; `error` says why) */
      status: number | null;
      error: {
        code: string;
        message: string;
      } | null;
      /** Format: date-time */
      sentAt: string | null;
      /** Format: date-time */
      firstByteAt: string | null;
      /** Format: date-time */
      endedAt: string | null;
      /** @description From sent to the answer's end */
      durationMs: number | null;
      requestBytes: number;
      responseBytes: number;
      /** @description An OpenAI- or Anthropic-style completion's model */
      model: string | null;
      inputTokens: number | null;
      outputTokens: number | null;
      /** @description The request body is kept (up to UPSTREAM_KEEP_BODY_BYTES) */
      requestBodyKept: boolean;
      /** @description The response body is kept: a retry with the same Idempotency-Key is answered from it */
      responseBodyKept: boolean;
      /** Format: date-time */
      createdAt: string;
    };
    OperationDetail: components["schemas"]["Operation"] & ({
      /** @description The response's headers as the agent got them (hop-by-hop removed) */
      responseHeaders: [string, string][] | null;
    });
  };
  responses: never;
  parameters: {
  };
  requestBodies: never;
  headers: never;
  pathItems: never;
};

export type $defs = Record<string, never>;

export type external = Record<string, never>;

export type operations = {

  /** Liveness: the process answers (wakes nothing, needs no database) */
  health: {
    responses: {
      /** @description Alive */
      200: {
        content: {
          "application/json": {
            /** @enum {boolean} */
            ok: true;
          };
        };
      };
    };
  };
  /** Readiness: names each dependency up or down */
  ready: {
    responses: {
      /** @description Ready */
      200: {
        content: {
          "application/json": {
            /** @enum {boolean} */
            ok: true;
            [key: string]: ("up" | "down") | true;
          };
        };
      };
      /** @description A dependency is down (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** List the tenant's agents, oldest first, a page at a time */
  listAgents: {
    parameters: {
      query?: {
        /** @description Opaque: the `nextCursor` of the previous page */
        cursor?: string;
        /** @description Items per page (default 100, at most 1000) */
        limit?: number;
        /** @description Only agents in this state as the database last recorded it (each host writes it on a transition); the `state` an agent shows is its host's live one, which may be newer */
        state?: components["schemas"]["VmState"];
        /** @description Only agents whose name starts with this (case-sensitive) */
        namePrefix?: string;
        /** @description Only agents of this image: its `image` as shown (`demo`, `name:tag`), or its `imageDigest` (`sha256:…`) */
        image?: string;
      };
    };
    responses: {
      /** @description A page of agents */
      200: {
        content: {
          "application/json": components["schemas"]["AgentList"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Create an agent (it sleeps until its first call) */
  createAgent: {
    requestBody: {
      content: {
        "application/json": components["schemas"]["CreateAgent"];
      };
    };
    responses: {
      /** @description The agent (with `fromCheckpoint`: hibernated on the checkpoint, `forkedFrom` set) */
      201: {
        content: {
          "application/json": components["schemas"]["Agent"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** An agent, with its live state */
  getAgent: {
    parameters: {
      path: {
        id: string;
      };
    };
    responses: {
      /** @description The agent */
      200: {
        content: {
          "application/json": components["schemas"]["Agent"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Delete an agent (its VM is removed from its host) */
  deleteAgent: {
    parameters: {
      path: {
        id: string;
      };
    };
    responses: {
      /** @description Deleted */
      200: {
        content: {
          "application/json": components["schemas"]["AgentDeleted"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Change what may change on a live agent: idle timeouts, non-waking rules (null = defaults), limits (null = global), egress (while it sleeps) */
  updateAgent: {
    parameters: {
      path: {
        id: string;
      };
    };
    requestBody: {
      content: {
        "application/json": components["schemas"]["UpdateAgent"];
      };
    };
    responses: {
      /** @description The agent as changed */
      200: {
        content: {
          "application/json": components["schemas"]["Agent"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not allowed here */
      405: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Hibernate an agent now */
  hibernateAgent: {
    parameters: {
      path: {
        id: string;
      };
    };
    responses: {
      /** @description The state it is in */
      200: {
        content: {
          "application/json": components["schemas"]["AgentState"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Wake an agent now */
  wakeAgent: {
    parameters: {
      path: {
        id: string;
      };
    };
    responses: {
      /** @description Awake: how it woke and what that cost */
      200: {
        content: {
          "application/json": components["schemas"]["Wake"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Keep an agent awake for a while (a lease), waking it */
  addAgentLease: {
    parameters: {
      path: {
        id: string;
      };
    };
    requestBody: {
      content: {
        "application/json": components["schemas"]["AddLease"];
      };
    };
    responses: {
      /** @description The lease */
      201: {
        content: {
          "application/json": components["schemas"]["Lease"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** End a lease before it expires */
  dropAgentLease: {
    parameters: {
      path: {
        id: string;
        leaseId: string;
      };
    };
    responses: {
      /** @description Dropped */
      200: {
        content: {
          "application/json": components["schemas"]["LeaseDropped"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** An agent's VM event log (state transitions with reasons and timings), newest first, a page at a time */
  listAgentEvents: {
    parameters: {
      query?: {
        /** @description Opaque: the `nextCursor` of the previous page */
        cursor?: string;
        /** @description Items per page (default 100, at most 1000) */
        limit?: number;
        /** @description Only events at or after this instant */
        since?: string;
        /** @description Only events before this instant */
        until?: string;
      };
      path: {
        id: string;
      };
    };
    responses: {
      /** @description A page of events */
      200: {
        content: {
          "application/json": components["schemas"]["AgentEventList"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** The agent's checkpoints, oldest first, a page at a time */
  listCheckpoints: {
    parameters: {
      query?: {
        /** @description Opaque: the `nextCursor` of the previous page */
        cursor?: string;
        /** @description Items per page (default 100, at most 1000) */
        limit?: number;
      };
      path: {
        id: string;
      };
    };
    responses: {
      /** @description A page of checkpoints */
      200: {
        content: {
          "application/json": components["schemas"]["CheckpointList"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Keep a checkpoint of the agent: an immutable copy of its memory and disk (an awake agent pauses for it) */
  createCheckpoint: {
    parameters: {
      path: {
        id: string;
      };
    };
    requestBody: {
      content: {
        "application/json": components["schemas"]["CreateCheckpoint"];
      };
    };
    responses: {
      /** @description The checkpoint */
      201: {
        content: {
          "application/json": components["schemas"]["Checkpoint"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** One of the agent's checkpoints */
  getCheckpoint: {
    parameters: {
      path: {
        id: string;
        checkpointId: string;
      };
    };
    responses: {
      /** @description The checkpoint */
      200: {
        content: {
          "application/json": components["schemas"]["Checkpoint"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Delete a checkpoint (its files are removed; agents forked from it keep theirs) */
  deleteCheckpoint: {
    parameters: {
      path: {
        id: string;
        checkpointId: string;
      };
    };
    responses: {
      /** @description Deleted */
      200: {
        content: {
          "application/json": components["schemas"]["CheckpointDeleted"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Roll the agent back to one of its checkpoints: stopped if awake, then hibernated on the checkpoint (its snapshot replaced); the next call wakes it */
  restoreAgent: {
    parameters: {
      path: {
        id: string;
      };
    };
    requestBody: {
      content: {
        "application/json": components["schemas"]["RestoreAgent"];
      };
    };
    responses: {
      /** @description The agent, hibernated on the checkpoint */
      200: {
        content: {
          "application/json": components["schemas"]["Agent"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Roll a forked agent back to the checkpoint it was forked from (`forkedFrom`): one episode ends, the next starts from the same state; it is woken in the background */
  resetAgent: {
    parameters: {
      path: {
        id: string;
      };
    };
    responses: {
      /** @description The agent, rolled back (awake or waking) */
      200: {
        content: {
          "application/json": components["schemas"]["AgentReset"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** The tenant's pools, oldest first, with their counts */
  listPools: {
    responses: {
      /** @description The pools */
      200: {
        content: {
          "application/json": components["schemas"]["PoolList"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Create a warm pool: `size` hibernated forks of a checkpoint kept ready to hand out, reset to it when given back */
  createPool: {
    requestBody: {
      content: {
        "application/json": components["schemas"]["CreatePool"];
      };
    };
    responses: {
      /** @description The pool (its agents are forked in the background) */
      201: {
        content: {
          "application/json": components["schemas"]["Pool"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** One pool, with how many of its agents are ready, in use and being made ready */
  getPool: {
    parameters: {
      path: {
        id: string;
      };
    };
    responses: {
      /** @description The pool */
      200: {
        content: {
          "application/json": components["schemas"]["Pool"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Delete a pool: its agents that are not handed out are deleted; handed-out ones stay with their holders as ordinary agents */
  deletePool: {
    parameters: {
      path: {
        id: string;
      };
    };
    responses: {
      /** @description Deleted */
      200: {
        content: {
          "application/json": components["schemas"]["PoolDeleted"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Change a pool's size and maxSize: a larger pool is topped up at once; a smaller one deletes its surplus ready agents (never handed-out ones) */
  resizePool: {
    parameters: {
      path: {
        id: string;
      };
    };
    requestBody: {
      content: {
        "application/json": components["schemas"]["ResizePool"];
      };
    };
    responses: {
      /** @description The pool with its new sizes (its top-up under way) */
      200: {
        content: {
          "application/json": components["schemas"]["Pool"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /**
   * Hand out one of the pool's agents (never the same one to two callers), woken in the background; one is forked now when none is ready and the pool is below maxSize
   * @description At maxSize with none ready but some being made ready (forked by the top-up, reset after a release), it waits for one of them up to `waitMs` (default 10 s). `409 pool_exhausted` when every agent is handed out (at once), or none became ready in time (with `Retry-After`).
   */
  acquirePoolAgent: {
    parameters: {
      query?: {
        /** @description When none is ready and the pool is at maxSize with agents being made ready: how long to wait for one, ms (default 10000, at most 60000; 0: 409 at once) */
        waitMs?: number;
      };
      path: {
        id: string;
      };
    };
    responses: {
      /** @description The agent, awake or waking */
      200: {
        content: {
          "application/json": components["schemas"]["PoolAcquired"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Give a handed-out agent back: reset to the pool's checkpoint (hibernated on it) and ready for the next acquire */
  releasePoolAgent: {
    parameters: {
      path: {
        id: string;
      };
    };
    requestBody: {
      content: {
        "application/json": components["schemas"]["ReleasePoolAgent"];
      };
    };
    responses: {
      /** @description The agent, ready in the pool */
      200: {
        content: {
          "application/json": components["schemas"]["PoolReleased"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /**
   * An agent's log (console + workload output): its tail, and with follow what it writes next; never wakes the agent
   * @description Plain text, or Server-Sent Events (one `data:` event per line, keep-alive comments while following) when `Accept: text/event-stream`.
   */
  getAgentLogs: {
    parameters: {
      query?: {
        /** @description Bytes from the end of the log to start with (default 65536, at most 1073741824) */
        tail?: string;
        /** @description Go on with what the agent writes next, until the client goes away (default false) */
        follow?: "0" | "1" | "true" | "false" | "";
      };
      path: {
        id: string;
      };
    };
    responses: {
      /** @description The log */
      200: {
        content: {
          "text/plain": string;
          "text/event-stream": string;
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /**
   * The caller's tenant's audit log, newest first, a page at a time
   * @description Admin actions, wakes, hibernations and webhook deliveries, each with who, what, when and the request id; every entry carries its hash chain links (`seq`, `hash`, `prevHash`).
   */
  listAudit: {
    parameters: {
      query?: {
        /** @description Opaque: the `nextCursor` of the previous page */
        cursor?: string;
        /** @description Items per page (default 100, at most 1000) */
        limit?: number;
        /** @description Only entries of this action (exact) */
        action?: string;
        /** @description Only entries about this target (an agent, endpoint, delivery or image id; exact) */
        target?: string;
        /** @description Only entries at or after this instant */
        since?: string;
        /** @description Only entries before this instant */
        until?: string;
      };
    };
    responses: {
      /** @description A page of entries */
      200: {
        content: {
          "application/json": components["schemas"]["AuditList"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Recompute the audit hash chains and name the first broken row of each (operator) */
  verifyAudit: {
    parameters: {
      query?: {
        /** @description Verify this tenant's chain only (an empty value: the rows without a tenant); absent: every chain */
        tenant?: string;
      };
    };
    responses: {
      /** @description The verdict of each chain */
      200: {
        content: {
          "application/json": components["schemas"]["AuditVerification"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** The warm templates new agents are cloned from, on every live host: ready, building, or failed (operator) */
  listTemplates: {
    responses: {
      /** @description Every live host's templates, by host then key */
      200: {
        content: {
          "application/json": components["schemas"]["TemplateList"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /**
   * Run a command inside the agent's VM (waking it), or start one in the background
   * @description Runs `cmd` in the agent's root as the image's user (or `user`), with the image's environment plus `env`; the agent stays awake while it runs. `Accept: application/json` (default) waits and answers the exit status with stdout and stderr (each at most 1048576 bytes: beyond it `truncated`). `Accept: application/x-ndjson` streams one JSON object a line as output comes: `{"stdout":…}`, `{"stderr":…}`, `{"error":…}` (it could not start), last `{"exit":{exitCode,signal,timedOut,durationMs}}`. `background: true` answers 201 with the process (see `/processes`).
   */
  execInAgent: {
    parameters: {
      path: {
        id: string;
      };
    };
    requestBody: {
      content: {
        "application/json": components["schemas"]["ExecRequest"];
      };
    };
    responses: {
      /** @description It ended (JSON), or its output as it comes (NDJSON) */
      200: {
        content: {
          "application/json": components["schemas"]["ExecResult"];
          "application/x-ndjson": string;
        };
      };
      /** @description Started in the background */
      201: {
        content: {
          "application/json": components["schemas"]["Process"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** The background processes started in the agent (running and exited), waking it */
  listAgentProcesses: {
    parameters: {
      path: {
        id: string;
      };
    };
    responses: {
      /** @description The processes */
      200: {
        content: {
          "application/json": components["schemas"]["ProcessList"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** One background process */
  getAgentProcess: {
    parameters: {
      path: {
        id: string;
        pid: string;
      };
    };
    responses: {
      /** @description The process */
      200: {
        content: {
          "application/json": components["schemas"]["Process"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Wait for a background process to exit (at most timeoutMs), answering it as it is then */
  waitAgentProcess: {
    parameters: {
      path: {
        id: string;
        pid: string;
      };
    };
    requestBody: {
      content: {
        "application/json": components["schemas"]["ProcessWait"];
      };
    };
    responses: {
      /** @description The process */
      200: {
        content: {
          "application/json": components["schemas"]["Process"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Write to a background process's standard input (and close it with eof) */
  writeAgentProcessStdin: {
    parameters: {
      path: {
        id: string;
        pid: string;
      };
    };
    requestBody: {
      content: {
        "application/json": components["schemas"]["ProcessStdin"];
      };
    };
    responses: {
      /** @description Written */
      204: {
        content: never;
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Send a signal to a background process's group */
  signalAgentProcess: {
    parameters: {
      path: {
        id: string;
        pid: string;
      };
    };
    requestBody: {
      content: {
        "application/json": components["schemas"]["ProcessSignal"];
      };
    };
    responses: {
      /** @description Sent */
      204: {
        content: never;
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Read a background process's output from an offset (the VM keeps 16 MiB per stream) */
  readAgentProcessOutput: {
    parameters: {
      query?: {
        stream?: "stdout" | "stderr";
        /** @description Bytes of the stream already read (its `nextOffset`) */
        offset?: number;
        /** @description Bytes at most (default 65536, at most 1048576) */
        limit?: number;
        encoding?: "utf8" | "base64";
      };
      path: {
        id: string;
        pid: string;
      };
    };
    responses: {
      /** @description A piece of the stream */
      200: {
        content: {
          "application/json": components["schemas"]["ProcessOutput"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /**
   * Read a file (streamed), list a directory, or with Accept: application/x-tar a tree as tar
   * @description A regular file's bytes with `x-file-mode` (octal), `x-file-uid`, `x-file-gid` and `last-modified`; a directory's entries as JSON; with `Accept: application/x-tar` the file or tree as a tar (modes and owners kept). Paths are inside the agent's root: absolute, no `..`; symlinks resolve inside it.
   */
  readAgentFile: {
    parameters: {
      query: {
        path: string;
      };
      path: {
        id: string;
      };
    };
    responses: {
      /** @description The file's bytes, the directory's listing, or the tar */
      200: {
        content: {
          "application/octet-stream": string;
          "application/json": components["schemas"]["DirListing"];
          "application/x-tar": string;
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /**
   * Write a file (streamed; replaced whole, never seen half-written), or with Content-Type: application/x-tar extract a tree under path
   * @description The body is the file's bytes, at most 4294967296 bytes (the agent's own request-body limit does not apply). With `Content-Type: application/x-tar` it is a tar extracted under `path` (made), modes and owners kept; an entry that would leave `path` (`..`, an absolute link) is refused (400) with nothing after it written.
   */
  writeAgentFile: {
    parameters: {
      query: {
        path: string;
        /** @description The file's mode (default 0644) */
        mode?: string;
        /** @description Owner (default: the image's user) */
        uid?: number;
        gid?: number;
        /** @description Make missing parent directories */
        mkdirs?: boolean;
      };
      path: {
        id: string;
      };
    };
    requestBody: {
      content: {
        "application/octet-stream": string;
        "application/x-tar": string;
      };
    };
    responses: {
      /** @description Written */
      201: {
        content: {
          "application/json": components["schemas"]["FileWritten"] | components["schemas"]["TarWritten"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Delete a file, or with recursive=true a directory and what it holds */
  deleteAgentFile: {
    parameters: {
      query: {
        path: string;
        /** @description Delete a directory and what it holds */
        recursive?: boolean;
      };
      path: {
        id: string;
      };
    };
    responses: {
      /** @description Deleted */
      204: {
        content: never;
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /**
   * Run a command on a terminal inside the agent's VM, interactively (a WebSocket)
   * @description A WebSocket upgrade (Node gateways; a Worker answers 501), with the bearer token in Authorization (a browser offers the subprotocols `agentvm.tty` and `agentvm.bearer.<token>` instead). The command starts (waking the agent, which stays awake while it runs) before the `101`: a refusal is a plain answer with the error envelope. Then binary messages are the terminal's bytes both ways; text messages are JSON control: in `{"resize":{"rows":n,"cols":n}}`, out `{"error":"…"}` (it could not start) and `{"exit":{"code":n|null,"signal":"HUP"|null,"timedOut":false,"durationMs":n}}` before the close. Close codes: 1000 it exited, 1001 the gateway is going away or the agent is going to sleep, 1008 a bad control message, 1011 an error (the reason is the error envelope, cut to fit). Closing the socket hangs the command up (SIGHUP); one still running 5 s later is killed.
   */
  execTtyInAgent: {
    parameters: {
      query: {
        /** @description A command line run by `/bin/sh -c` (or give `arg`; neither: `/bin/sh`) */
        cmd?: string;
        /** @description The argv, one `arg` each, in order (the program looked up in PATH) */
        arg?: string | string[];
        /** @description The terminal's height */
        rows: string;
        /** @description The terminal's width */
        cols: string;
        /** @description `NAME=VALUE` over the image's environment, repeated (TERM defaults to xterm-256color) */
        env?: string | string[];
        /** @description Working directory (default: the image's) */
        cwd?: string;
        /** @description Run as this user (name, uid or uid:gid); default: the image's user */
        user?: string;
      };
      path: {
        id: string;
      };
    };
    responses: {
      /** @description Switching protocols: the terminal's WebSocket */
      101: {
        content: never;
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Who is watching the agent's desktop, and who holds control (through any gateway) */
  desktopViewers: {
    parameters: {
      path: {
        id: string;
      };
    };
    responses: {
      /** @description The viewers connected now, oldest first */
      200: {
        content: {
          "application/json": components["schemas"]["DesktopViewers"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /**
   * A viewer's WebSocket to the agent's screen (RFB, as noVNC speaks it): view only, or with control=true the keyboard and pointer
   * @description A WebSocket upgrade (Node gateways; a Worker answers 501), the bearer token in Authorization or, from a browser, offered as the subprotocol `agentvm.bearer.<token>` beside `binary` (the one the answer selects). Binary messages are RFB both ways (noVNC's `RFB` class connects to it as it is). The connection wakes the agent and holds it awake while it is open (a keep-awake lease, counted in the agent's `leases`). `control=true` needs `desktop:control` (or `agents:admin`) as well as `agents:exec`, and one holder at a time across gateways (409 while another holds it); while it is held the actions API answers 409. Listed by `GET /v1/agents/{id}/desktop/viewers`. Audited: `agent.desktop.view` when a viewer leaves, `agent.desktop.control` when control is taken and when it is given back (with how long). Closes 1001 when the agent goes to sleep under it or the gateway stops.
   */
  desktopVnc: {
    parameters: {
      query?: {
        /** @description Take over the keyboard and pointer (needs desktop:control or agents:admin as well); default false: view only */
        control?: "true" | "false";
      };
      path: {
        id: string;
      };
    };
    responses: {
      /** @description Switching protocols: the viewer's WebSocket */
      101: {
        content: never;
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /**
   * The agent's screen as a PNG (waking it: a hibernated desktop comes back as it was)
   * @description The whole display, `scale` times its size (nearest pixel). `x-desktop-width` and `x-desktop-height` give the display's own size, `x-wake` the wake the call caused. `409 no_desktop` for an agent whose image has no desktop.
   */
  desktopScreenshot: {
    parameters: {
      query?: {
        /** @description Scale the picture by this factor, 0.1 to 1 (default 1: the display's own size) */
        scale?: string;
      };
      path: {
        id: string;
      };
    };
    responses: {
      /** @description The screen */
      200: {
        content: {
          "image/png": string;
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /**
   * Act on the agent's screen: move, click, drag, scroll, type, keys, wait (waking it); answers the cursor and the screen after the last action
   * @description At most 50 actions, run in order; coordinates must be on the agent's display and keys known (else 400 before anything runs). The answer has the cursor and, unless `screenshot: false`, the screen after the last action as a base64 PNG. Recorded in the audit log as `agent.desktop.actions` (the actions' types and the number of characters typed, never the text).
   */
  desktopActions: {
    parameters: {
      path: {
        id: string;
      };
    };
    requestBody: {
      content: {
        "application/json": components["schemas"]["DesktopActions"];
      };
    };
    responses: {
      /** @description Done */
      200: {
        content: {
          "application/json": components["schemas"]["DesktopActionsResult"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /**
   * A sender delivers a webhook: signed (Standard Webhooks or GitHub), stored durably, then delivered to the agent
   * @description No bearer token: the signature is the credential (`webhook-id`, `webhook-timestamp`, `webhook-signature` for standard endpoints; `X-Hub-Signature-256` and `X-GitHub-Delivery` for github ones). The body is kept byte for byte, whatever its type.
   */
  deliverWebhook: {
    parameters: {
      path: {
        agentId: string;
        endpointName: string;
      };
    };
    requestBody: {
      content: {
        "*/*": string;
      };
    };
    responses: {
      /** @description Stored; the agent is woken and the delivery attempted */
      202: {
        content: {
          "application/json": components["schemas"]["WebhookAccepted"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not allowed here */
      405: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Too many requests (Retry-After) */
      429: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** The agent's webhook endpoints, by name (never their secrets) */
  listWebhookEndpoints: {
    parameters: {
      query?: {
        /** @description Opaque: the `nextCursor` of the previous page */
        cursor?: string;
        /** @description Items per page (default 100, at most 1000) */
        limit?: number;
      };
      path: {
        /** @description Agent id */
        id: string;
      };
    };
    responses: {
      /** @description A page of endpoints */
      200: {
        content: {
          "application/json": components["schemas"]["WebhookEndpointPage"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Create a signed webhook endpoint of the agent; the answer is the only one that shows its secret */
  createWebhookEndpoint: {
    parameters: {
      path: {
        /** @description Agent id */
        id: string;
      };
    };
    requestBody: {
      content: {
        "application/json": components["schemas"]["NewWebhookEndpoint"];
      };
    };
    responses: {
      /** @description The endpoint with its secret */
      201: {
        content: {
          "application/json": components["schemas"]["WebhookEndpointWithSecret"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** One webhook endpoint */
  getWebhookEndpoint: {
    parameters: {
      path: {
        /** @description Agent id */
        id: string;
        /** @description Endpoint name */
        name: string;
      };
    };
    responses: {
      /** @description The endpoint */
      200: {
        content: {
          "application/json": components["schemas"]["WebhookEndpoint"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Stop accepting deliveries (those already accepted are still delivered) */
  deleteWebhookEndpoint: {
    parameters: {
      path: {
        /** @description Agent id */
        id: string;
        /** @description Endpoint name */
        name: string;
      };
    };
    responses: {
      /** @description Deleted */
      204: {
        content: never;
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** A new secret; the one it replaces keeps verifying for overlapS seconds */
  rotateWebhookSecret: {
    parameters: {
      path: {
        /** @description Agent id */
        id: string;
        /** @description Endpoint name */
        name: string;
      };
    };
    requestBody: {
      content: {
        "application/json": components["schemas"]["WebhookRotation"];
      };
    };
    responses: {
      /** @description The endpoint with its new secret */
      200: {
        content: {
          "application/json": components["schemas"]["WebhookEndpointWithSecret"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** The endpoint's deliveries, newest first, each with its attempts (bodies: see getWebhookDelivery) */
  listWebhookDeliveries: {
    parameters: {
      query?: {
        /** @description Opaque: the `nextCursor` of the previous page */
        cursor?: string;
        /** @description Items per page (default 100, at most 1000) */
        limit?: number;
      };
      path: {
        /** @description Agent id */
        id: string;
        /** @description Endpoint name */
        name: string;
      };
    };
    responses: {
      /** @description A page of deliveries */
      200: {
        content: {
          "application/json": components["schemas"]["WebhookDeliveryPage"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** One delivery with its attempts, headers and body */
  getWebhookDelivery: {
    parameters: {
      path: {
        /** @description Delivery id */
        id: string;
      };
    };
    responses: {
      /** @description The delivery */
      200: {
        content: {
          "application/json": components["schemas"]["WebhookDeliveryDetail"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Queue the delivery again now with a fresh attempt budget (also after delivery); 409 while an attempt runs */
  redeliverWebhook: {
    parameters: {
      path: {
        /** @description Delivery id */
        id: string;
      };
    };
    responses: {
      /** @description Queued */
      202: {
        content: {
          "application/json": components["schemas"]["WebhookRedelivery"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Ship meter segments (a host, with its component token of audience billing); idempotent per segment id */
  ingestMeterSegments: {
    requestBody: {
      content: {
        "application/json": components["schemas"]["MeterBatch"];
      };
    };
    responses: {
      /** @description Each segment accepted, a duplicate, or rejected with its code */
      200: {
        content: {
          "application/json": components["schemas"]["MeterIngestResult"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Active time, vCPU-ms and MiB-ms of the tenant over [from, to), by agent and/or local hour or day in a zone */
  getUsage: {
    parameters: {
      query: {
        /** @description Start of the range (inclusive): an ISO 8601 instant with Z or an offset, or a date YYYY-MM-DD (years 1970–9999) */
        from: string;
        /** @description End of the range (exclusive): an ISO 8601 instant with Z or an offset, or a date YYYY-MM-DD (years 1970–9999) */
        to: string;
        /** @description IANA time zone that local dates, hours and days are in (default UTC) */
        tz?: string;
        /** @description Comma list of agent, hour, day (or tenant): rows per agent and/or per local hour or day */
        groupBy?: string;
        /** @description Only this agent's usage */
        agentId?: string;
        /** @description Answer as JSON or CSV; without it `Accept: text/csv` asks for CSV */
        format?: "json" | "csv";
        /** @description Only the caller's own tenant (another answers 404) */
        tenantId?: string;
        /** @description Same as tenantId */
        tenant?: string;
      };
    };
    responses: {
      /** @description The usage rows and their totals */
      200: {
        content: {
          "application/json": components["schemas"]["Usage"];
          "text/csv": string;
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** The agent's awake runs, newest first: what woke it, the wake's timings, what put it to sleep, metered time */
  listAgentRuns: {
    parameters: {
      query?: {
        /** @description Opaque: the `nextCursor` of the previous page */
        cursor?: string;
        /** @description Items per page (default 100, at most 1000) */
        limit?: number;
        /** @description Runs that woke at or after this instant (a bare date is a UTC day): an ISO 8601 instant with Z or an offset, or a date YYYY-MM-DD (years 1970–9999) */
        from?: string;
        /** @description Runs that woke before this instant (a bare date is a UTC day): an ISO 8601 instant with Z or an offset, or a date YYYY-MM-DD (years 1970–9999) */
        until?: string;
        /** @description Same as until: an ISO 8601 instant with Z or an offset, or a date YYYY-MM-DD (years 1970–9999) */
        to?: string;
        /** @description Answer as JSON or CSV; without it `Accept: text/csv` asks for CSV */
        format?: "json" | "csv";
      };
      path: {
        /** @description Agent id */
        id: string;
      };
    };
    responses: {
      /** @description A page of runs */
      200: {
        headers: {
          /** @description The next page's cursor, when there is one */
          "x-next-cursor"?: string;
        };
        content: {
          "application/json": components["schemas"]["RunPage"];
          "text/csv": string;
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** The tenant's invoices, newest month first; with `month`, that month's invoice */
  listInvoices: {
    parameters: {
      query?: {
        /** @description Opaque: the `nextCursor` of the previous page */
        cursor?: string;
        /** @description Items per page (default 100, at most 1000) */
        limit?: number;
        /** @description Answer this month's invoice (created, as a draft, on first use) instead of the list */
        month?: string;
        /** @description Answer as JSON or CSV; without it `Accept: text/csv` asks for CSV */
        format?: "json" | "csv";
        /** @description Only the caller's own tenant (another answers 404) */
        tenantId?: string;
        /** @description Same as tenantId */
        tenant?: string;
      };
    };
    responses: {
      /** @description A page of invoices (an Invoice with `month`) */
      200: {
        headers: {
          /** @description The next page's cursor, when there is one */
          "x-next-cursor"?: string;
        };
        content: {
          "application/json": components["schemas"]["InvoicePage"] | components["schemas"]["Invoice"];
          "text/csv": string;
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** One invoice with its lines: stored if final, computed now if a draft */
  getInvoice: {
    parameters: {
      query?: {
        /** @description Answer as JSON or CSV; without it `Accept: text/csv` asks for CSV */
        format?: "json" | "csv";
      };
      path: {
        /** @description Invoice id */
        id: string;
      };
    };
    responses: {
      /** @description The invoice */
      200: {
        content: {
          "application/json": components["schemas"]["Invoice"];
          "text/csv": string;
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Freeze the month's invoice (agents:admin): from the month's end + grace; finalizing twice answers the same invoice */
  finalizeInvoice: {
    parameters: {
      path: {
        /** @description Calendar month YYYY-MM in the tenant's time zone */
        month: string;
      };
    };
    responses: {
      /** @description The final invoice */
      200: {
        content: {
          "application/json": components["schemas"]["Invoice"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** The tenant's own card versions, newest first, and the version pricing it now (operator) */
  listTenantRateCardVersions: {
    parameters: {
      query?: {
        /** @description Opaque: the `nextCursor` of the previous page */
        cursor?: string;
        /** @description Items per page (default 100, at most 1000) */
        limit?: number;
      };
      path: {
        /** @description Tenant id */
        id: string;
      };
    };
    responses: {
      /** @description A page of versions */
      200: {
        content: {
          "application/json": components["schemas"]["RateCardVersionPage"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Add a version of the tenant's card (operator): it prices the tenant's usage from `effectiveFrom` until its next version */
  addTenantRateCardVersion: {
    parameters: {
      path: {
        /** @description Tenant id */
        id: string;
      };
    };
    requestBody: {
      content: {
        "application/json": components["schemas"]["NewRateCardVersion"];
      };
    };
    responses: {
      /** @description The version written */
      201: {
        content: {
          "application/json": components["schemas"]["RateCardVersion"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** The default card's versions, newest first, and the one in effect now (operator) */
  listDefaultRateCardVersions: {
    parameters: {
      query?: {
        /** @description Opaque: the `nextCursor` of the previous page */
        cursor?: string;
        /** @description Items per page (default 100, at most 1000) */
        limit?: number;
      };
    };
    responses: {
      /** @description A page of versions */
      200: {
        content: {
          "application/json": components["schemas"]["RateCardVersionPage"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Add a version of the default card (operator): it prices every tenant without a version of its own at that time */
  addDefaultRateCardVersion: {
    requestBody: {
      content: {
        "application/json": components["schemas"]["NewRateCardVersion"];
      };
    };
    responses: {
      /** @description The version written */
      201: {
        content: {
          "application/json": components["schemas"]["RateCardVersion"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** The card version pricing the caller's tenant now, and every version that priced or will price it (past and scheduled) */
  listRateCards: {
    parameters: {
      query?: {
        /** @description Opaque: the `nextCursor` of the previous page */
        cursor?: string;
        /** @description Items per page (default 100, at most 1000) */
        limit?: number;
      };
    };
    responses: {
      /** @description The current version and a page of versions */
      200: {
        content: {
          "application/json": components["schemas"]["TenantRateCards"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** The prices in effect now for the tenant (its card version, or the default card's); see /v1/rate-cards for every version */
  getRateCard: {
    responses: {
      /** @description The tenant's rate card (or the default one) */
      200: {
        content: {
          "application/json": components["schemas"]["RateCard"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** The tenant's images, by name then tag */
  listImages: {
    parameters: {
      query?: {
        /** @description Opaque: the `nextCursor` of the previous page */
        cursor?: string;
        /** @description Items per page (default 100, at most 1000) */
        limit?: number;
      };
    };
    responses: {
      /** @description A page of images */
      200: {
        content: {
          "application/json": components["schemas"]["ImagePage"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /**
   * Build an image from a tar of a build context (Containerfile), or import an OCI / docker save archive
   * @description Waits and answers 201 with the image, or 422 build_failed / 400 bad_archive with the reason. With `Accept: application/x-ndjson` it streams the build's events instead, one JSON object a line: first `{type:"build"}`, then step/log/progress events, last `{type:"image"}` or `{type:"error"}`.
   */
  createImage: {
    parameters: {
      query: {
        /** @description Image name (lowercase, `/` allowed) */
        name: string;
        /** @description Tag (default latest); an existing name:tag moves to the new digest */
        tag?: string;
        /** @description containerfile: the body is a tar of the build context; archive: an OCI archive or a `docker save` tarball */
        kind?: "containerfile" | "archive";
        /** @description The Containerfile's path inside the context (default Containerfile, else Dockerfile) */
        file?: string;
      };
    };
    /** @description The build context as a tar, or the image archive */
    requestBody: {
      content: {
        "application/x-tar": string;
        "application/octet-stream": string;
      };
    };
    responses: {
      /** @description The build's events as NDJSON (with Accept: application/x-ndjson) */
      200: {
        headers: {
          "x-build-id": string;
        };
        content: {
          "application/x-ndjson": string;
        };
      };
      /** @description Built and registered */
      201: {
        headers: {
          "x-build-id": string;
        };
        content: {
          "application/json": components["schemas"]["ImageBuilt"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not allowed here */
      405: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unprocessable */
      422: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** A build's status (builds are kept in this process's memory) */
  getImageBuild: {
    parameters: {
      path: {
        /** @description Build id */
        id: string;
      };
    };
    responses: {
      /** @description The build */
      200: {
        content: {
          "application/json": components["schemas"]["ImageBuild"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not allowed here */
      405: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** A build's log as text; with follow=true it streams until the build ends */
  getImageBuildLog: {
    parameters: {
      query?: {
        /** @description true: stream the log until the build ends */
        follow?: "true" | "false";
      };
      path: {
        /** @description Build id */
        id: string;
      };
    };
    responses: {
      /** @description The log, a line per event */
      200: {
        content: {
          "text/plain": string;
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not allowed here */
      405: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** One image */
  getImage: {
    parameters: {
      path: {
        /** @description Image id */
        id: string;
      };
    };
    responses: {
      /** @description The image */
      200: {
        content: {
          "application/json": components["schemas"]["Image"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Delete the tag; the files go when no tag names the digest (409 while a live agent runs the last one) */
  deleteImage: {
    parameters: {
      path: {
        /** @description Image id */
        id: string;
      };
    };
    responses: {
      /** @description Deleted */
      200: {
        content: {
          "application/json": components["schemas"]["ImageDeleted"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** List tenants, oldest first, a page at a time (operator) */
  listTenants: {
    parameters: {
      query?: {
        /** @description Opaque: the `nextCursor` of the previous page */
        cursor?: string;
        /** @description Items per page (default 100, at most 1000) */
        limit?: number;
        /** @description Only tenants in this status */
        status?: components["schemas"]["TenantStatus"];
      };
    };
    responses: {
      /** @description A page of tenants */
      200: {
        content: {
          "application/json": components["schemas"]["TenantList"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Create a tenant (operator) */
  createTenant: {
    requestBody: {
      content: {
        "application/json": components["schemas"]["NewTenant"];
      };
    };
    responses: {
      /** @description The tenant */
      201: {
        content: {
          "application/json": components["schemas"]["Tenant"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** A tenant (operator) */
  getTenant: {
    parameters: {
      path: {
        id: string;
      };
    };
    responses: {
      /** @description The tenant */
      200: {
        content: {
          "application/json": components["schemas"]["Tenant"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Delete a tenant: its agents are destroyed, the row is kept as deleted with its usage and invoices (operator; idempotent) */
  deleteTenant: {
    parameters: {
      path: {
        id: string;
      };
    };
    responses: {
      /** @description Deleted */
      200: {
        content: {
          "application/json": components["schemas"]["TenantDeleted"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Bad gateway */
      502: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Timeout */
      504: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Suspend a tenant: its tokens and agents get 403 tenant_suspended, its awake agents are hibernated, nothing is deleted (operator; idempotent) */
  suspendTenant: {
    parameters: {
      path: {
        id: string;
      };
    };
    requestBody: {
      content: {
        "application/json": components["schemas"]["TenantStatusChange"];
      };
    };
    responses: {
      /** @description Suspended */
      200: {
        content: {
          "application/json": components["schemas"]["TenantSuspended"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Resume a suspended tenant (operator; idempotent) */
  resumeTenant: {
    parameters: {
      path: {
        id: string;
      };
    };
    responses: {
      /** @description Active */
      200: {
        content: {
          "application/json": components["schemas"]["Tenant"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** List hosts by id, a page at a time, each with its health, load and agents (operator) */
  listHosts: {
    parameters: {
      query?: {
        /** @description Opaque: the `nextCursor` of the previous page */
        cursor?: string;
        /** @description Items per page (default 100, at most 1000) */
        limit?: number;
      };
    };
    responses: {
      /** @description A page of hosts */
      200: {
        content: {
          "application/json": components["schemas"]["HostList"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** A host with its health, load and agents (operator) */
  getHost: {
    parameters: {
      path: {
        id: string;
      };
    };
    responses: {
      /** @description The host */
      200: {
        content: {
          "application/json": components["schemas"]["Host"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Drain a host: it takes no new agents, and its agents hibernate and wake on other hosts; answered once marked, the moves follow (operator; idempotent) */
  drainHost: {
    parameters: {
      path: {
        id: string;
      };
    };
    responses: {
      /** @description Marked draining */
      202: {
        content: {
          "application/json": components["schemas"]["Host"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Stop draining a host: it takes new agents again (agents that moved away stay where they are; operator; idempotent) */
  undrainHost: {
    parameters: {
      path: {
        id: string;
      };
    };
    responses: {
      /** @description No longer draining */
      200: {
        content: {
          "application/json": components["schemas"]["Host"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** The tenant's upstreams by name (header names only) */
  listUpstreams: {
    parameters: {
      query?: {
        /** @description Opaque: the `nextCursor` of the previous page */
        cursor?: string;
        /** @description Items per page (default 100, at most 1000) */
        limit?: number;
      };
    };
    responses: {
      /** @description A page of upstreams */
      200: {
        content: {
          "application/json": components["schemas"]["UpstreamList"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Name an outbound endpoint the tenant's agents call through their host (`/u/<name>/…`), with secret headers the agents never see */
  createUpstream: {
    requestBody: {
      content: {
        "application/json": components["schemas"]["NewUpstream"];
      };
    };
    responses: {
      /** @description The upstream (header names only) */
      201: {
        content: {
          "application/json": components["schemas"]["Upstream"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Conflict */
      409: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** One upstream (header names only) */
  getUpstream: {
    parameters: {
      path: {
        /** @description Upstream name */
        name: string;
      };
    };
    responses: {
      /** @description The upstream */
      200: {
        content: {
          "application/json": components["schemas"]["Upstream"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Delete an upstream: agents' calls to it answer 404 upstream_not_found (its operations are kept) */
  deleteUpstream: {
    parameters: {
      path: {
        /** @description Upstream name */
        name: string;
      };
    };
    responses: {
      /** @description Deleted */
      204: {
        content: never;
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** Change an upstream's base URL and/or replace its whole set of secret headers (hosts see it within their cache's few seconds) */
  updateUpstream: {
    parameters: {
      path: {
        /** @description Upstream name */
        name: string;
      };
    };
    requestBody: {
      content: {
        "application/json": components["schemas"]["UpstreamPatch"];
      };
    };
    responses: {
      /** @description The upstream */
      200: {
        content: {
          "application/json": components["schemas"]["Upstream"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Body too large */
      413: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Error */
      501: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** The agent's calls through its tenant's upstreams, newest first, a page at a time */
  listOperations: {
    parameters: {
      query?: {
        /** @description Opaque: the `nextCursor` of the previous page */
        cursor?: string;
        /** @description Items per page (default 100, at most 1000) */
        limit?: number;
        /** @description Only calls through this upstream */
        upstream?: string;
        /** @description Only operations in this state */
        state?: "queued" | "in_flight" | "succeeded" | "failed";
        /** @description Only operations created at or after this instant */
        since?: string;
      };
      path: {
        id: string;
      };
    };
    responses: {
      /** @description A page of operations */
      200: {
        content: {
          "application/json": components["schemas"]["OperationList"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
  /** One of the agent's operations, with the response headers it got */
  getOperation: {
    parameters: {
      path: {
        id: string;
        opId: string;
      };
    };
    responses: {
      /** @description The operation */
      200: {
        content: {
          "application/json": components["schemas"]["OperationDetail"];
        };
      };
      /** @description Bad request: a field, a parameter or the body is invalid */
      400: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description No valid token */
      401: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description The token lacks the scope */
      403: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Not found (another tenant's resources do not exist for the caller) */
      404: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
      /** @description Unavailable (Retry-After) */
      503: {
        content: {
          "application/json": components["schemas"]["Error"];
        };
      };
    };
  };
};
