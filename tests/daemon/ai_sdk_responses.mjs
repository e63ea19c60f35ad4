// The Vercel AI SDK's default OpenAI provider (npm "ai" and "@ai-sdk/openai", pinned by
// check_ai_sdk_responses.sh), which talks to /v1/responses, against towerd over its Unix socket: a
// chat of three turns as an application writes it (the whole conversation each time, the SDK turning
// earlier replies into item references) is one towerd session whose turns are served from its cached
// segments, streamed or not. Prints "ok NAME" or "FAIL NAME: why"; exits 1 when one failed.
//   node ai_sdk_responses.mjs SOCKET
import assert from 'node:assert/strict';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, streamText } from 'ai';
import { runChecks, unixSocketFetch } from './node_client.mjs';

const openai = createOpenAI({ apiKey: 'unused', baseURL: 'http://towerd/v1', fetch: unixSocketFetch(process.argv[2]) });
const model = openai('stories260K');  // the default provider: the Responses API
const settings = { model, system: 'Tell a story.', temperature: 0, maxOutputTokens: 10, maxRetries: 0 };

// The session a response id names (towerd's ids are resp_<session>_<turn>: docs/api.md, "Responses").
const sessionOf = (id) => /^resp_(.+)_(\d+)$/.exec(id)?.slice(1);

const checks = {
  async chat_on_one_session() {
    const messages = [{ role: 'user', content: 'Once upon a time' }];
    const r1 = await generateText({ ...settings, messages });
    assert.ok(r1.text.length > 0);
    const [session, turn1] = sessionOf(r1.response.id);
    assert.equal(turn1, '1');
    let prev = r1;
    for (const [i, said] of [[2, 'The cat'], [3, 'The dog']]) {
      messages.push(...prev.response.messages, { role: 'user', content: said });
      let r;
      if (i === 3) {  // the last turn streamed
        const s = streamText({ ...settings, messages });
        let text = '';
        for await (const piece of s.textStream) text += piece;
        r = { text, usage: await s.usage, response: await s.response };
      } else {
        r = await generateText({ ...settings, messages });
      }
      assert.deepEqual(sessionOf(r.response.id), [session, String(i)], `turn ${i} is ${r.response.id}`);
      // Every earlier turn is served from the session's segments: the previous prompt and reply (all
      // but its last token, sampled and never evaluated).
      const need = prev.usage.inputTokens + prev.usage.outputTokens - 1;
      assert.ok(r.usage.inputTokenDetails.cacheReadTokens >= need,
        `turn ${i}: cached ${r.usage.inputTokenDetails.cacheReadTokens} < ${need}`);
      prev = r;
    }
  },
};

await runChecks(checks);
