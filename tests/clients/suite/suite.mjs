// Issue 23's client suite against towerd: the AI SDK (ai_sdk.mjs) and LangChain JS (langchain.mjs).
// Prints "ok NAME (ms)", "FAIL NAME: why" or "SKIP NAME: why" per check; exits 1 when one failed.
//   node suite.mjs SOCKET [CHECK...]
import { checks as aiSdk } from './ai_sdk.mjs';
import { runChecks } from './node_client.mjs';

const checks = { ...aiSdk };
// LangChain JS 1.x needs node 20 or newer: an older node skips its checks by name.
const nodeMajor = Number(process.versions.node.split('.')[0]);
if (nodeMajor >= 20) {
  Object.assign(checks, (await import('./langchain.mjs')).checks);
} else {
  console.log(`SKIP langchain_*: LangChain JS 1.x needs node >= 20 (this is ${process.version})`);
}
await runChecks(checks, process.argv.slice(3));
