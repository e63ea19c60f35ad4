// What the client suite's checks share: the socket's fetch, towerd's own endpoints (segments,
// sessions) called directly, and the settings that keep stories260K quick.
import assert from 'node:assert/strict';
import { unixSocketFetch } from './node_client.mjs';

export const socket = process.argv[2];
export const fetchOverSocket = unixSocketFetch(socket);
export const baseURL = 'http://towerd/v1';
export const modelId = 'stories260K';

// towerd's own API (not an OpenAI client's): JSON in, JSON out, an HTTP error is an exception.
export async function towerd(method, path, body) {
  const r = await fetchOverSocket(`${baseURL}${path}`, {
    method, headers: { 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  if (!r.ok) throw new Error(`${method} ${path}: HTTP ${r.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

// A bot under a platform, defined once per run (PUT is idempotent for the same text).
export async function defineBot(name) {
  await towerd('PUT', '/segments/suite', { level: 'platform', text: 'You tell short stories.' });
  await towerd('PUT', `/segments/${name}`, { level: 'bot', parent: 'suite', text: `Your name is ${name}.` });
  return name;
}

export async function newSession(bot) {
  return (await towerd('POST', '/sessions', { bot })).id;
}

export const transcriptOf = async (session) => (await towerd('GET', `/sessions/${session}?transcript=1`));

// A vector of unit length (towerd's embeddings are L2-normalised).
export function assertUnit(v, n) {
  assert.equal(v.length, n);
  const norm = Math.sqrt(v.reduce((s, x) => s + x * x, 0));
  assert.ok(Math.abs(norm - 1) < 1e-4, `norm ${norm}`);
}

export const sameVector = (a, b) => a.length === b.length && a.every((x, i) => Math.abs(x - b[i]) < 1e-6);
