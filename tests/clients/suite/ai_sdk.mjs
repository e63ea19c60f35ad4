// The Vercel AI SDK 6 ("ai") against towerd, as an application writes it: @ai-sdk/openai-compatible
// pointed at towerd (chat completions, embeddings) and the default @ai-sdk/openai provider (the
// Responses API). Issue 23, "How it is checked".
import assert from 'node:assert/strict';
import { createOpenAI } from '@ai-sdk/openai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { embed, embedMany, generateObject, generateText, stepCountIs, streamText, tool } from 'ai';
import { z } from 'zod';
import { assertUnit, baseURL, defineBot, fetchOverSocket, modelId, newSession, sameVector, transcriptOf } from './towerd.mjs';

// The provider's name is the key of its providerOptions, whose unknown members go into the body:
// towerd's own fields (`session`, `bot`) travel that way.
const towers = createOpenAICompatible({
  name: 'towerd', baseURL, apiKey: 'unused', fetch: fetchOverSocket, supportsStructuredOutputs: true, includeUsage: true,
});
const chat = towers.chatModel(modelId);
const openai = createOpenAI({ apiKey: 'unused', baseURL, fetch: fetchOverSocket });
const quick = { maxRetries: 0, maxOutputTokens: 12 };

const weather = (execute) => tool({
  description: 'The weather in a city',
  inputSchema: z.object({ city: z.string().max(12) }),
  ...(execute ? { execute } : {}),
});

// The call whose reply is a tool call, then the reply that reads its result: the loop of an agent.
const firstCallThenAnswer = ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? 'required' : 'none' });

// A tool loop's checks shared by both providers: a call of get_weather whose input follows the
// schema, executed once, then a text step.
function checkToolLoop(r, executed) {
  assert.equal(r.steps.length, 2, `steps: ${r.steps.map((s) => s.finishReason)}`);
  const [call] = r.steps[0].toolCalls;
  assert.equal(call.toolName, 'get_weather');
  assert.equal(typeof call.input.city, 'string');
  assert.deepEqual(executed, [call.input.city]);
  assert.equal(r.steps[0].finishReason, 'tool-calls');
  assert.deepEqual(r.steps[0].toolResults.map((t) => t.output), ['18 degrees']);
  assert.equal(r.steps[1].toolCalls.length, 0);
}

// The second step is served from the first's KV: its prompt and all of its reply but the last,
// sampled token (never evaluated).
function assertCachedTurn(first, second) {
  const cached = second.usage.inputTokenDetails.cacheReadTokens;
  const need = first.usage.inputTokens + first.usage.outputTokens - 1;
  assert.ok(cached >= need, `cached ${cached} < ${need}`);
}

// A two-step tool loop through the openai-compatible provider with towerd's own body fields
// (`session` or `bot`), run by generateText or streamText; checked by checkToolLoop.
async function chatToolLoop(run, prompt, towerdFields) {
  const executed = [];
  const r = await run({  // generateText: a promise of the result; streamText: the result, its fields promises
    model: chat, prompt, maxRetries: 0, maxOutputTokens: 150, temperature: 1, seed: 3,
    tools: { get_weather: weather(async ({ city }) => { executed.push(city); return '18 degrees'; }) },
    prepareStep: firstCallThenAnswer, stopWhen: stepCountIs(4),
    providerOptions: { towerd: { ...towerdFields, parallel_tool_calls: false } },
  });
  const done = { steps: await r.steps, text: await r.text };
  checkToolLoop(done, executed);
  return done;
}

export const checks = {
  async ai_generate_text() {
    const r = await generateText({ ...quick, model: chat, prompt: 'Once upon a time', temperature: 0 });
    assert.ok(r.text.length > 0);
    assert.ok(['stop', 'length'].includes(r.finishReason), r.finishReason);
    assert.ok(r.usage.inputTokens > 0 && r.usage.outputTokens > 0 && r.usage.outputTokens <= 12, JSON.stringify(r.usage));
  },

  // Streamed and whole replies of the same seeded request are the same text; another seed, another text.
  async ai_stream_text_seeded() {
    const settings = { ...quick, model: chat, prompt: 'Once upon a time', temperature: 1, seed: 11, maxOutputTokens: 16 };
    const whole = await generateText(settings);
    const s = streamText(settings);
    const pieces = [];
    for await (const p of s.textStream) pieces.push(p);
    assert.ok(pieces.length > 1, `one piece: ${pieces}`);
    assert.equal(pieces.join(''), whole.text);
    assert.equal((await s.usage).outputTokens, whole.usage.outputTokens);
    const others = await Promise.all([12, 13, 14].map((seed) => generateText({ ...settings, seed })));
    assert.ok(others.some((o) => o.text !== whole.text), 'four seeds, one text');
  },

  // zod 4's .int() (minimum/maximum ±2^53-1), .email().max() (format, pattern and maxLength), a union
  // (anyOf), a literal (const): the reply follows the schema, so the SDK's own zod validation passes.
  async ai_generate_object() {
    const schema = z.object({
      age: z.number().int().min(0).max(120),
      email: z.string().email().max(24),  // without a bound stories260K never ends an address
      pet: z.union([
        z.object({ kind: z.literal('cat'), lives: z.number().int() }),
        z.object({ kind: z.literal('dog'), name: z.string().max(8) }),
      ]),
    });
    for (const seed of [1, 2]) {
      const r = await generateObject({ model: chat, schema, prompt: 'A person', maxRetries: 0, maxOutputTokens: 120, temperature: 1, seed });
      assert.ok(Number.isInteger(r.object.age) && r.object.age >= 0 && r.object.age <= 120, JSON.stringify(r.object));
      assert.ok(/^[^@]+@[^@]+\.[A-Za-z]{2,}$/.test(r.object.email) && r.object.email.length <= 24, r.object.email);
      assert.ok(['cat', 'dog'].includes(r.object.pet.kind));
    }
  },

  // toolChoice 'required': a call whose input follows the tool's schema, whole and streamed alike
  // (the same seed); default options: a reply that is text or calls, never call markup as text.
  async ai_tool_calls() {
    const settings = { model: chat, prompt: 'What is the weather in Paris?', tools: { get_weather: weather() },
      maxRetries: 0, maxOutputTokens: 150, temperature: 1, seed: 5 };
    const r = await generateText({ ...settings, toolChoice: 'required' });
    assert.equal(r.finishReason, 'tool-calls');
    assert.ok(r.toolCalls.length >= 1);
    for (const c of r.toolCalls) {
      assert.equal(c.toolName, 'get_weather');
      assert.ok(typeof c.input.city === 'string' && c.input.city.length <= 12, JSON.stringify(c.input));
    }
    const s = streamText({ ...settings, toolChoice: 'required' });
    const streamed = await s.toolCalls;
    assert.deepEqual(streamed.map((c) => c.input), r.toolCalls.map((c) => c.input));
    for (const seed of [1, 2, 3]) {
      const d = await generateText({ ...settings, seed });
      assert.ok(d.toolCalls.length > 0 ? d.finishReason === 'tool-calls' : !d.text.includes('<tool_call>'),
        `${d.finishReason}: ${JSON.stringify(d.text)}`);
    }
  },

  // An agent's loop on a bot's session: the SDK sends the whole conversation on every step (user,
  // its call, the result); the session keeps it as two turns, the second served from the first's KV.
  // Streamed on a twin session, the same calls and answer.
  async ai_tool_loop_on_bot_session() {
    const bot = await defineBot('suite-ai-sdk');
    const [session, twin] = [await newSession(bot), await newSession(bot)];
    const r = await chatToolLoop(generateText, 'What is the weather in Paris?', { session });
    const [first, second] = r.steps;
    assertCachedTurn(first, second);
    const t = await transcriptOf(session);
    assert.equal(t.bot, bot);
    assert.deepEqual(t.transcript.map((m) => m.role), ['user', 'assistant', 'tool', 'assistant']);
    assert.equal(t.transcript[1].tool_calls[0].function.name, 'get_weather');
    assert.equal(t.transcript[2].content, '18 degrees');
    const streamed = await chatToolLoop(streamText, 'What is the weather in Paris?', { session: twin });
    assert.deepEqual(streamed.steps[0].toolCalls.map((c) => c.input), first.toolCalls.map((c) => c.input));
    assert.equal(streamed.text, r.text);
    // The loop on the same bot without a session (the conversation is the request's): the same shape.
    await chatToolLoop(generateText, 'What is the weather in Rome?', { bot });
  },

  async ai_embed() {
    const embedding = towers.embeddingModel(modelId);
    const one = await embed({ model: embedding, value: 'Once upon a time', maxRetries: 0 });
    const n = one.embedding.length;
    assert.ok(n > 0);
    assertUnit(one.embedding, n);
    const many = await embedMany({ model: embedding, values: ['The cat', 'Once upon a time', 'The cat'], maxRetries: 0 });
    assert.equal(many.embeddings.length, 3);
    for (const v of many.embeddings) assertUnit(v, n);
    assert.ok(sameVector(many.embeddings[1], one.embedding), 'a text gets the same vector alone or among others');
    assert.ok(sameVector(many.embeddings[0], many.embeddings[2]));
    assert.ok(!sameVector(many.embeddings[0], many.embeddings[1]));
    assert.ok(many.usage.tokens > 0);
    // The default provider's embedding model reads the same endpoint.
    const viaOpenAI = await embed({ model: openai.embedding(modelId), value: 'Once upon a time', maxRetries: 0 });
    assert.ok(sameVector(viaOpenAI.embedding, one.embedding));
  },

  // The default provider (@ai-sdk/openai: the Responses API): text, a structured object, and a tool
  // loop, whose second step sends the call back as a function_call item with its output.
  async ai_default_provider_responses() {
    const model = openai(modelId);
    const r = await generateText({ ...quick, model, system: 'Tell a story.', prompt: 'Once upon a time', temperature: 0 });
    assert.ok(r.text.length > 0);
    assert.match(r.response.id, /^resp_/);
    const o = await generateObject({ model, schema: z.object({ n: z.number().int().min(1).max(9), word: z.string().max(8) }),
      prompt: 'A number', maxRetries: 0, maxOutputTokens: 60, temperature: 0 });
    assert.ok(Number.isInteger(o.object.n) && o.object.n >= 1 && o.object.n <= 9, JSON.stringify(o.object));
    const executed = [];
    const loop = await generateText({
      model, prompt: 'What is the weather in Paris?', maxRetries: 0, maxOutputTokens: 150, temperature: 0,  // no seed on Responses
      tools: { get_weather: weather(async ({ city }) => { executed.push(city); return '18 degrees'; }) },
      prepareStep: firstCallThenAnswer, stopWhen: stepCountIs(4), providerOptions: { openai: { parallelToolCalls: false } },
    });
    checkToolLoop(loop, executed);
    const [first, second] = loop.steps;
    assertCachedTurn(first, second);
  },
};
