// The TypeScript SDK 1.32 (`@modelcontextprotocol/sdk`, the closest stand-in for VS Code's client) against the
// example server: the 2025-11-25 experimental Tasks design, over Streamable HTTP, as TOKEN's principal, then
// OTHER_TOKEN's; a deployment's question is answered through its elicitation handler. Installed into tests/interop/.ts-sdk by tests/interop/test_ts_sdk_tasks.py:
//
//     node tests/interop/ts_sdk_client.mjs URL TOKEN OTHER_TOKEN
//
// Prints what it saw as one JSON object on stdout. With `--nodes TOKEN URL FROM [--hold]` it reads a deployment's
// question through tasks/result on URL and answers it through its elicitation handler (`--hold`: prints what it saw
// once asked and leaves the question open while it lives); FROM is another node's URL to create the deployment on
// first, or the taskId of one created before.
import path from "node:path";

const sdk = path.join(process.env.TS_SDK_DIR, "node_modules", "@modelcontextprotocol", "sdk", "dist", "esm");
const { Client } = await import(path.join(sdk, "client", "index.js"));
const { StreamableHTTPClientTransport } = await import(path.join(sdk, "client", "streamableHttp.js"));
const { CallToolResultSchema, CreateTaskResultSchema, ElicitRequestSchema, TaskStatusNotificationSchema } = await import(
  path.join(sdk, "types.js")
);

const [url, token, otherToken] = process.argv.slice(2);

const seen = { asked: [], statuses: [] };
const hold = process.argv.includes("--hold");

async function connect(bearer, at = url) {
  const client = new Client({ name: "ts-sdk-older-tasks", version: "0" }, { capabilities: { elicitation: { form: {} } } });
  // The deployment's question, asked on the tasks/result stream; the answer goes back as a POST of its own.
  client.setRequestHandler(ElicitRequestSchema, async (request) => {
    seen.asked.push(request.params);
    if (hold) {
      console.log(JSON.stringify(seen));
      await new Promise(() => {});
    }
    return { action: "accept", content: { approve: true, environment: "production" } };
  });
  client.setNotificationHandler(TaskStatusNotificationSchema, (notification) => {
    seen.statuses.push(notification.params.status);
  });
  const headers = { Authorization: `Bearer ${bearer}` };
  await client.connect(new StreamableHTTPClientTransport(new URL(at), { requestInit: { headers } }));
  return client;
}

async function attempt(call) {
  try {
    return await call;
  } catch (error) {
    return { error: { code: error.code, message: error.message } };
  }
}

async function startTask(client, name, args) {
  const call = { name, arguments: args, task: { ttl: 60000 } };
  return (await client.request({ method: "tools/call", params: call }, CreateTaskResultSchema)).task.taskId;
}

if (url === "--nodes") {
  // A deployment created on the node at FROM (or FROM, a taskId), its question read and answered through
  // tasks/result on a new session with the node at URL.
  const [bearer, at, origin] = process.argv.slice(3, 6);
  seen.taskId = origin;
  if (origin.startsWith("http")) {
    const creator = await connect(bearer, origin);
    seen.taskId = await startTask(creator, "deploy_release", { version: "8.0.0" });
    await creator.close();
  }
  const client = await connect(bearer, at);
  seen.result = await client.experimental.tasks.getTaskResult(seen.taskId, CallToolResultSchema);
  await client.close();
  console.log(JSON.stringify(seen));
  process.exit(0);
}

const owner = await connect(token);
const tasks = owner.experimental.tasks;
seen.protocol = owner.transport.protocolVersion ?? null;
seen.capabilities = owner.getServerCapabilities().tasks ?? null;
const { tools } = await owner.listTools();
seen.execution = Object.fromEntries(tools.map((tool) => [tool.name, tool.execution?.taskSupport ?? null]));

// What VS Code does: the SDK makes a call of a task-capable tool a task and streams it to its result.
seen.streamed = [];
for await (const message of tasks.callToolStream({ name: "generate_report", arguments: { account: "acme", months: 2 } })) {
  seen.streamed.push(message.type);
  if (message.type === "taskCreated") seen.reportId = message.task.taskId;
  if (message.type === "result") seen.report = message.result.structuredContent;
  if (message.type === "error") seen.streamError = String(message.error);
}
seen.reportResult = (await tasks.getTaskResult(seen.reportId, CallToolResultSchema)).structuredContent;

// A task that asks: the stream meets input_required, calls tasks/result, and the handler above answers.
seen.deployStream = [];
for await (const message of tasks.callToolStream({ name: "deploy_release", arguments: { version: "4.0.0" } })) {
  seen.deployStream.push(message.type);
  if (message.type === "taskCreated") seen.deployId = message.task.taskId;
  if (message.type === "result") seen.deployed = message.result.structuredContent;
  if (message.type === "error") seen.deployError = String(message.error);
}

// The explicit calls.
seen.exportId = await startTask(owner, "export_dataset", { rows: 1000 });
seen.got = (await tasks.getTask(seen.exportId)).status;
seen.cancelled = (await tasks.cancelTask(seen.exportId)).status;
seen.cancelAgain = await attempt(tasks.cancelTask(seen.exportId));
seen.listed = (await tasks.listTasks()).tasks.map((task) => task.taskId);
await owner.close();

const other = await connect(otherToken);
seen.other = {
  get: await attempt(other.experimental.tasks.getTask(seen.reportId)),
  madeUp: await attempt(other.experimental.tasks.getTask(seen.reportId.slice(0, -4) + "AAAA")),
  listed: (await other.experimental.tasks.listTasks()).tasks.map((task) => task.taskId),
};
await other.close();
console.log(JSON.stringify(seen));
