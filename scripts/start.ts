// `npm start`: the whole system in one process on an embedded database; prints the demo agent's URL and a token.
import { resolve } from "node:path";
import { parseEnv } from "../lib/env.ts";
import { createLogger } from "../lib/log.ts";
import { stopOnSignals } from "../lib/signals.ts";
import { selectDriver } from "../fleet-agent/drivers/select.ts";
import { customKernelOf } from "../fleet-agent/guest/kernel-env.ts";
import { allInOneConfigOf, allInOneEnv, startAllInOne } from "../compose/all-in-one.ts";
import { ensureDashboard } from "./build-dashboard.ts";
import { prepareVmPath } from "./vm-path.ts";

// The one read of the environment: every variable of `npm start` (compose/all-in-one.ts: allInOneEnv), parsed once.
const settings = parseEnv(allInOneEnv, process.env);
const log = createLogger({ level: settings.LOG_LEVEL });
const dataDir = resolve(settings.DATA_DIR);
// Real VMs where they can be had: QEMU and the guest image are provisioned here (apt as root on Debian), else one line says why not.
const kernel = customKernelOf(settings);
const vm = await prepareVmPath(settings.DRIVER, { dataDir, say: (line) => console.log(line), ...(kernel ? { kernel } : {}) });
const selected = await selectDriver(vm.driver, { dataDir, log, settings, ...(vm.image ? { image: vm.image } : {}) });
const { driver, images, upstreams, exchanges } = selected;
const notice = vm.notice ?? selected.notice;
if (notice) console.log(notice);
await ensureDashboard({ log: (line) => console.log(line) }).catch((err: Error) => console.log(`dashboard not built (${err.message}): /dashboard/ answers 404`));
const system = await startAllInOne(allInOneConfigOf(settings, images), { driver, log, exchanges, ...(upstreams ? { upstreams } : {}) });

const agentUrl = `${system.url}/a/${system.demo.agentId}/`;
console.log(`
agentvm is running (driver: ${driver.name}${driver.isolated ? "" : ", NOT isolated"}; data: ${dataDir}; database: ${system.database.kind})

  gateway     ${system.url}
  demo agent  ${agentUrl}
  token       ${system.demo.token}
  operator    ${system.operatorToken}
              (scope operator only: agentvm tenants ls|create|suspend|resume|rm, /v1/tenants)
  metrics     ${system.url}/metrics  (Authorization: Bearer ${system.metricsToken})

Call the demo agent (the first call wakes it):
  curl -H "Authorization: Bearer ${system.demo.token}" ${agentUrl}counter -X POST

Mint other tokens with: npm run token -- --tenant ${system.demo.tenantId} --scopes agents:invoke,agents:admin,agents:exec,usage:read
  (an operator token: npm run token -- --operator; other tenants: agentvm tenants create --id ten_x --name X, then --tenant ten_x)
Stop with Ctrl-C.
`);

stopOnSignals(
  () => system.stop(),
  log,
  (signal) => console.log(`\n${signal}: stopping (draining requests, hibernating agents)…`),
);
