// What the Node clients' checks (openai_sdk_client.mjs, ai_sdk_responses.mjs) share: fetch() over
// towerd's Unix socket, and running named checks.
import http from 'node:http';
import { Readable } from 'node:stream';

// The SDK talks through fetch(); this one sends the request over a Unix socket with node:http and
// hands back a standard Response whose body streams (SSE replies arrive as they are written).
export function unixSocketFetch(socketPath) {
  return (url, init = {}) => new Promise((resolve, reject) => {
    const u = new URL(url);
    const headers = {};
    new Headers(init.headers).forEach((v, k) => { headers[k] = v; });
    const req = http.request({ socketPath, path: u.pathname + u.search, method: init.method ?? 'GET', headers }, (res) => {
      const h = new Headers();
      for (const [k, v] of Object.entries(res.headers)) h.set(k, Array.isArray(v) ? v.join(', ') : v);
      resolve(new Response(Readable.toWeb(res), { status: res.statusCode, statusText: res.statusMessage, headers: h }));
    });
    req.on('error', reject);
    init.signal?.addEventListener('abort', () => req.destroy(new Error('aborted')));
    req.end(init.body ?? undefined);
  });
}

// Runs the checks (an object of name -> async function; `only`: the names to run, [] = all), prints
// "ok NAME (ms)" or "FAIL NAME: why" for each and exits 1 when one failed.
export async function runChecks(checks, only = []) {
  let failed = 0;
  for (const [name, check] of Object.entries(checks)) {
    if (only.length && !only.includes(name)) continue;
    const t0 = Date.now();
    try {
      await check();
      console.log(`ok ${name} (${Date.now() - t0} ms)`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${name}: ${e.stack ?? e}${e.cause ? `\n  cause: ${e.cause.stack ?? e.cause}` : ''}`);
    }
  }
  process.exit(failed ? 1 : 0);
}
