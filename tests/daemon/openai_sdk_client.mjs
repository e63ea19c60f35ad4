// The official OpenAI Node SDK (npm "openai", version pinned by check_openai_sdk.sh) against towerd
// over its Unix socket: every check parses towerd's replies with the SDK's own types and streaming
// code, and asserts what OpenAI's API reference promises. Prints "ok NAME" or "FAIL NAME: why" per
// check; exits 1 when one failed.
//   node openai_sdk_client.mjs SOCKET
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { runChecks, unixSocketFetch } from './node_client.mjs';

const client = new OpenAI({
  apiKey: 'unused', baseURL: 'http://towerd/v1', fetch: unixSocketFetch(process.argv[2]), maxRetries: 0, timeout: 120000,
});
const model = 'stories260K';
const user = (content) => [{ role: 'user', content }];
const greedy = { model, temperature: 0, max_tokens: 12 };

async function collect(stream) {
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}
const textOf = (chunks, index = 0) =>
  chunks.flatMap((c) => c.choices.filter((ch) => ch.index === index).map((ch) => ch.delta?.content ?? ch.text ?? '')).join('');
const utf8 = (bytes) => Buffer.from(bytes).toString('utf8');

// A reply's logprobs entries: OpenAI's shape, probabilities that make sense, and the tokens' bytes
// spell the text (the first token may carry the leading space the text drops).
function checkChatLogprobs(content, text, top) {
  assert.ok(Array.isArray(content) && content.length > 0);
  for (const e of content) {
    assert.equal(typeof e.token, 'string');
    assert.ok(e.logprob <= 0 && e.logprob >= -9999);
    assert.ok(Array.isArray(e.bytes));
    assert.equal(e.top_logprobs.length, top);
    for (let i = 1; i < e.top_logprobs.length; ++i) assert.ok(e.top_logprobs[i - 1].logprob >= e.top_logprobs[i].logprob);
    const sum = e.top_logprobs.reduce((s, t) => s + Math.exp(t.logprob), 0);
    assert.ok(sum <= 1 + 1e-4, `top probabilities sum to ${sum}`);
  }
  const spelled = utf8(content.flatMap((e) => e.bytes));
  assert.ok(spelled === text || spelled === ' ' + text, `tokens spell ${JSON.stringify(spelled)}, text is ${JSON.stringify(text)}`);
}

async function expectApiError(promise, status, code, param) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, `not an APIError: ${e}`);
    assert.equal(e.status, status, e.message);
    assert.equal(e.code, code, e.message);
    if (param !== undefined) assert.equal(e.param, param, e.message);
    return e;
  }
  assert.fail(`expected HTTP ${status} ${code}`);
}

const checks = {
  async models() {
    const list = await client.models.list();
    assert.equal(list.data[0].id, model);
    assert.equal((await client.models.retrieve(model)).id, model);
  },

  async chat() {
    const r = await client.chat.completions.create({ ...greedy, messages: user('Tell me a story.') });
    assert.equal(r.object, 'chat.completion');
    assert.match(r.id, /^chatcmpl-/);
    assert.equal(r.model, model);
    assert.equal(r.choices.length, 1);
    const c = r.choices[0];
    assert.equal(c.index, 0);
    assert.equal(c.message.role, 'assistant');
    assert.ok(typeof c.message.content === 'string' && c.message.content.length > 0);
    assert.ok(['stop', 'length'].includes(c.finish_reason));
    assert.equal(c.logprobs, null);
    assert.ok(r.usage.prompt_tokens > 0 && r.usage.completion_tokens > 0);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  },

  async stream() {
    const body = { ...greedy, messages: user('Tell me a story.') };
    const whole = await client.chat.completions.create(body);
    const chunks = await collect(await client.chat.completions.create({ ...body, stream: true }));
    assert.equal(chunks[0].choices[0].delta.role, 'assistant');
    for (const c of chunks) {
      assert.equal(c.object, 'chat.completion.chunk');
      assert.equal(c.id, chunks[0].id);
      assert.ok(c.usage == null, 'usage only when stream_options.include_usage asks for it');
    }
    assert.equal(textOf(chunks), whole.choices[0].message.content);
    assert.equal(chunks.at(-1).choices[0].finish_reason, whole.choices[0].finish_reason);
    // include_usage: one more chunk, with usage and no choices.
    const withUsage = await collect(await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } }));
    const last = withUsage.at(-1);
    assert.deepEqual(last.choices, []);
    assert.equal(last.usage.completion_tokens, whole.usage.completion_tokens);
    assert.equal(last.usage.prompt_tokens, whole.usage.prompt_tokens);
    for (const c of withUsage.slice(0, -1)) assert.ok(c.usage == null);
  },

  // Sampling without a seed draws a fresh one per request (named in towers.seed), so "regenerate"
  // gives another reply; the same seed, sent or read back from towers.seed, gives the same reply.
  async seeds() {
    const body = { model, temperature: 1, max_tokens: 16, messages: user('Once upon a time') };
    const unseeded = await Promise.all([1, 2, 3].map(() => client.chat.completions.create(body)));
    const texts = unseeded.map((r) => r.choices[0].message.content);
    assert.equal(new Set(unseeded.map((r) => r.towers.seed)).size, 3, 'three requests, one seed');
    assert.ok(new Set(texts).size > 1, `three requests without a seed, one text: ${texts[0]}`);
    const replayed = await client.chat.completions.create({ ...body, seed: unseeded[0].towers.seed });
    assert.equal(replayed.choices[0].message.content, texts[0]);
    const seeded = await Promise.all([1, 2].map(() => client.chat.completions.create({ ...body, seed: 42 })));
    assert.equal(seeded[0].choices[0].message.content, seeded[1].choices[0].message.content);
    assert.equal(seeded[0].towers.seed, 42);
  },

  async logprobs() {
    const body = { ...greedy, max_tokens: 16, messages: user('Once upon a time'), logprobs: true, top_logprobs: 3 };
    const r = await client.chat.completions.create(body);
    const content = r.choices[0].logprobs.content;
    checkChatLogprobs(content, r.choices[0].message.content, 3);
    assert.equal(content.length, r.usage.completion_tokens);
    // Greedy: the chosen token is the most likely one.
    for (const e of content) {
      assert.equal(e.token, e.top_logprobs[0].token);
      assert.equal(e.logprob, e.top_logprobs[0].logprob);
    }
    // Streamed: the same entries, spread over the chunks that carry their text.
    const chunks = await collect(await client.chat.completions.create({ ...body, stream: true }));
    const streamed = chunks.flatMap((c) => c.choices.flatMap((ch) => ch.logprobs?.content ?? []));
    assert.deepEqual(streamed, content);
    // Without top_logprobs: the chosen token only.
    const plain = await client.chat.completions.create({ ...body, top_logprobs: undefined });
    assert.deepEqual(plain.choices[0].logprobs.content.map((e) => e.top_logprobs.length), content.map(() => 0));
  },

  async penalties_and_logit_bias() {
    const body = { ...greedy, max_tokens: 24, messages: user('Once upon a time') };
    const base = (await client.chat.completions.create(body)).choices[0].message.content;
    const freq = (await client.chat.completions.create({ ...body, frequency_penalty: 2 })).choices[0].message.content;
    const pres = (await client.chat.completions.create({ ...body, presence_penalty: 2 })).choices[0].message.content;
    assert.notEqual(freq, base);
    assert.notEqual(pres, base);
    // A bias of 100 forces one token; -100 on it keeps it out.
    const forced = await client.chat.completions.create({ ...body, max_tokens: 4, logit_bias: { 300: 100 }, logprobs: true });
    const tokens = forced.choices[0].logprobs.content;
    assert.equal(tokens.length, 4);
    for (const e of tokens) {
      assert.deepEqual(e.bytes, tokens[0].bytes);
      assert.ok(e.logprob > -1e-3);
    }
    const banned = await client.chat.completions.create({ ...body, logit_bias: { 300: -100 }, logprobs: true });
    for (const e of banned.choices[0].logprobs.content) assert.notDeepEqual(e.bytes, tokens[0].bytes);
  },

  async n_choices() {
    const body = { model, max_tokens: 12, messages: user('Tell me a story.') };
    const greedyTwo = await client.chat.completions.create({ ...body, temperature: 0, n: 2 });
    assert.deepEqual(greedyTwo.choices.map((c) => c.index), [0, 1]);
    assert.equal(greedyTwo.choices[0].message.content, greedyTwo.choices[1].message.content);
    const sampled = await client.chat.completions.create({ ...body, temperature: 1, seed: 7, n: 2, logprobs: true });
    assert.equal(sampled.choices.length, 2);
    assert.notEqual(sampled.choices[0].message.content, sampled.choices[1].message.content);
    let total = 0;
    for (const c of sampled.choices) {
      checkChatLogprobs(c.logprobs.content, c.message.content, 0);
      total += c.logprobs.content.length;
    }
    assert.equal(sampled.usage.completion_tokens, total);
    // Streamed: each choice's deltas, its own finish, the same texts as the whole reply.
    const chunks = await collect(await client.chat.completions.create({ ...body, temperature: 1, seed: 7, n: 2, stream: true }));
    for (const i of [0, 1]) {
      assert.equal(textOf(chunks, i), sampled.choices[i].message.content);
      assert.equal(chunks.filter((c) => c.choices.some((ch) => ch.index === i && ch.finish_reason)).length, 1);
    }
  },

  async json_schema() {
    const schema = {
      type: 'object',
      properties: { name: { type: 'string', maxLength: 10 }, age: { type: 'integer' }, ok: { type: 'boolean' } },
      required: ['name', 'age', 'ok'],
      additionalProperties: false,
    };
    const response_format = { type: 'json_schema', json_schema: { name: 'person', schema, strict: true } };
    const body = { model, max_tokens: 120, temperature: 1, seed: 3, messages: user('Who are you?'), response_format };
    const whole = await client.chat.completions.create({ ...body, n: 2 });
    for (const c of whole.choices) {
      const v = JSON.parse(c.message.content);
      assert.deepEqual(Object.keys(v), ['name', 'age', 'ok']);  // in the schema's order, as OpenAI's strict mode
      assert.equal(typeof v.name, 'string');
      assert.ok(v.name.length <= 10);
      assert.ok(Number.isInteger(v.age));
      assert.equal(typeof v.ok, 'boolean');
      assert.equal(c.finish_reason, 'stop');
    }
    // Streamed: the same text as the whole reply with the same seed.
    const chunks = await collect(await client.chat.completions.create({ ...body, n: 2, stream: true }));
    assert.equal(textOf(chunks, 0), whole.choices[0].message.content);
    // A schema keyword the compiler does not support: 400 naming response_format.
    await assert.rejects(
      client.chat.completions.create({ ...body, response_format: { type: 'json_schema', json_schema: { name: 'p', schema: { type: 'integer', multipleOf: 2 } } } }),
      (e) => e.status === 400 && String(e.error?.param ?? '').startsWith('response_format'));
  },

  // Tools round trip: a required call is a valid call of a given tool (arguments parse and follow its
  // schema), streamed as OpenAI streams tool calls (id and name first, then argument pieces); the call
  // and its result go back in the history (assistant tool_calls with null content, a tool message)
  // and the model answers in text when tool_choice is "none".
  async tools() {
    const tools = [{
      type: 'function',
      function: {
        name: 'get_weather', description: 'The weather in a city',
        parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer' } },
                      required: ['city', 'days'], additionalProperties: false },
      },
    }, { type: 'function', function: { name: 'tell_time', parameters: { type: 'object', properties: {}, additionalProperties: false } } }];
    const body = { model, max_tokens: 150, temperature: 1, seed: 5, messages: user('What is the weather in Paris?'), tools };
    const whole = await client.chat.completions.create({ ...body, tool_choice: 'required', parallel_tool_calls: false });
    const c = whole.choices[0];
    assert.equal(c.finish_reason, 'tool_calls');
    assert.equal(c.message.content, null);
    assert.equal(c.message.tool_calls.length, 1);
    const call = c.message.tool_calls[0];
    assert.match(call.id, /^call_/);
    assert.equal(call.type, 'function');
    assert.ok(['get_weather', 'tell_time'].includes(call.function.name));
    const args = JSON.parse(call.function.arguments);
    if (call.function.name === 'get_weather') {
      assert.deepEqual(Object.keys(args), ['city', 'days']);
      assert.ok(typeof args.city === 'string' && args.city.length <= 12);
      assert.ok(Number.isInteger(args.days));
    }
    // A named choice: that function, always.
    const named = await client.chat.completions.create({ ...body, seed: 6, tool_choice: { type: 'function', function: { name: 'get_weather' } } });
    assert.equal(named.choices[0].message.tool_calls[0].function.name, 'get_weather');
    const namedArgs = JSON.parse(named.choices[0].message.tool_calls[0].function.arguments);
    assert.deepEqual(Object.keys(namedArgs), ['city', 'days']);
    assert.ok(typeof namedArgs.city === 'string' && namedArgs.city.length <= 12 && Number.isInteger(namedArgs.days));
    // Streamed with the same seed: the same call, in OpenAI's delta shape.
    const chunks = await collect(await client.chat.completions.create({ ...body, tool_choice: 'required', parallel_tool_calls: false, stream: true }));
    const deltas = chunks.flatMap((k) => k.choices.flatMap((ch) => ch.delta?.tool_calls ?? []));
    assert.ok(deltas.length >= 2, `${deltas.length} tool-call deltas`);
    assert.match(deltas[0].id, /^call_/);
    assert.equal(deltas[0].function.name, call.function.name);
    assert.ok(deltas.slice(1).every((d) => d.index === 0 && d.id === undefined && typeof d.function.arguments === 'string'));
    assert.equal(deltas.map((d) => d.function.arguments).join(''), call.function.arguments);
    assert.equal(chunks.at(-1).choices[0].finish_reason, 'tool_calls');
    // The round trip: the call and its result in the history; "none" asks for text.
    const history = [...body.messages, { role: 'assistant', content: null, tool_calls: [call] },
      { role: 'tool', tool_call_id: call.id, content: '{"sky": "sunny"}' }];
    const answer = await client.chat.completions.create({ model, max_tokens: 12, temperature: 0, messages: history, tools, tool_choice: 'none' });
    assert.equal(answer.choices[0].message.tool_calls, undefined);
    assert.equal(typeof answer.choices[0].message.content, 'string');
    // The call and its result are in the prompt: it is longer than the question's alone.
    const question = await client.chat.completions.create({ model, max_tokens: 1, messages: body.messages, tools, tool_choice: 'none' });
    assert.ok(answer.usage.prompt_tokens > question.usage.prompt_tokens + 10,
      `${answer.usage.prompt_tokens} prompt tokens with the call and result, ${question.usage.prompt_tokens} without`);
    // A choice naming no given tool: 400 naming the field.
    await expectApiError(client.chat.completions.create({ ...body, tool_choice: { type: 'function', function: { name: 'nope' } } }),
      400, 'invalid_request_error', 'tool_choice');
  },

  async completions() {
    const body = { model, prompt: 'Once upon a time, there was a', max_tokens: 12, temperature: 0 };
    const r = await client.completions.create(body);
    assert.equal(r.object, 'text_completion');
    assert.match(r.id, /^cmpl-/);
    assert.equal(r.choices[0].index, 0);
    assert.ok(r.choices[0].text.length > 0);
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    const chunks = await collect(await client.completions.create({ ...body, stream: true }));
    for (const c of chunks) assert.equal(c.object, 'text_completion');
    assert.equal(textOf(chunks), r.choices[0].text);
    // A prompt that extends it reuses its KV (the first prompt was sealed for reuse).
    const again = await client.completions.create({ ...body, prompt: body.prompt + ' little dog.' });
    assert.equal(again.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens);
    // Legacy logprobs: the chosen tokens, their logprobs, the top alternatives, offsets in the text.
    const lp = await client.completions.create({ ...body, logprobs: 2 });
    const l = lp.choices[0].logprobs;
    assert.equal(l.tokens.length, lp.usage.completion_tokens);
    assert.equal(l.token_logprobs.length, l.tokens.length);
    for (const t of l.top_logprobs) assert.equal(Object.keys(t).length, 2);
    assert.equal(l.text_offset[0], 0);
    for (let i = 1; i < l.text_offset.length; ++i) assert.ok(l.text_offset[i] >= l.text_offset[i - 1]);
  },

  // The Responses API (docs/api.md, "Responses"): three turns chained by previous_response_id are one
  // session's turns, and each turn's cached_tokens covers the turn before (its prompt and all but the
  // reply's last token); the SDK's own stream helper sees the typed events and the final response;
  // retrieve reads a response back, delete removes its chain; a function call and its output.
  async responses() {
    const base = { model, temperature: 0, max_output_tokens: 10, instructions: 'Tell a story.' };
    const r1 = await client.responses.create({ ...base, input: 'Once upon a time' });
    assert.equal(r1.object, 'response');
    assert.ok(r1.output_text.length > 0);
    let prev = r1;
    for (const input of ['The cat', 'The dog']) {
      const r = await client.responses.create({ ...base, input, previous_response_id: prev.id });
      assert.equal(r.previous_response_id, prev.id);
      assert.equal(r.session, r1.session);
      assert.ok(r.usage.input_tokens_details.cached_tokens >= prev.usage.input_tokens + prev.usage.output_tokens - 1,
        `cached ${r.usage.input_tokens_details.cached_tokens} < ${prev.usage.input_tokens} + ${prev.usage.output_tokens} - 1`);
      prev = r;
    }
    const stream = client.responses.stream({ ...base, input: 'A bird', previous_response_id: prev.id });
    const types = [];
    let deltas = '';
    for await (const e of stream) {
      types.push(e.type);
      if (e.type === 'response.output_text.delta') deltas += e.delta;
    }
    const last = await stream.finalResponse();
    assert.equal(types[0], 'response.created');
    assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)), types.join(' '));
    assert.equal(last.output_text, deltas);
    assert.equal(last.previous_response_id, prev.id);
    const got = await client.responses.retrieve(last.id);
    assert.equal(got.output_text, last.output_text);
    assert.equal(got.previous_response_id, prev.id);
    await client.responses.delete(r1.id);
    await expectApiError(client.responses.retrieve(last.id), 404, 'response_not_found');
    // Function calls on a session: a required call, then its output with previous_response_id.
    const tools = [{ type: 'function', name: 'get_weather', strict: true,
      parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'], additionalProperties: false } }];
    const f1 = await client.responses.create({ ...base, max_output_tokens: 200, input: 'Weather in Paris?', tools, tool_choice: 'required' });
    const calls = f1.output.filter((i) => i.type === 'function_call');
    assert.ok(calls.length > 0 && calls[0].name === 'get_weather', JSON.stringify(f1.output));
    assert.equal(typeof JSON.parse(calls[0].arguments).city, 'string');
    const f2 = await client.responses.create({ ...base, previous_response_id: f1.id, tool_choice: 'none',
      input: calls.map((c) => ({ type: 'function_call_output', call_id: c.call_id, output: '18 degrees' })) });
    assert.ok(f2.output_text.length > 0);
    assert.ok(f2.usage.input_tokens_details.cached_tokens >= f1.usage.input_tokens + f1.usage.output_tokens - 1);
    await expectApiError(client.responses.create({ ...base, input: 'x', tools: [{ type: 'web_search' }] }),
      400, 'unsupported_parameter', 'tools[0].type');
  },
  async errors() {
    await expectApiError(client.chat.completions.create({ model: 'no-such-model', messages: user('Hi') }), 404, 'model_not_found', 'model');
    const audio = await expectApiError(client.chat.completions.create({ ...greedy, messages: user('Hi'), audio: { voice: 'alloy', format: 'wav' } }),
      400, 'unsupported_parameter', 'audio');
    assert.match(audio.message, /audio/);
    await expectApiError(client.chat.completions.create({ ...greedy, messages: user('Hi'), prediction: { type: 'content', content: 'x' } }),
      400, 'unsupported_parameter', 'prediction');
    await expectApiError(client.chat.completions.create({ ...greedy, messages: user('Hi'), modalities: ['text', 'audio'] }),
      400, 'unsupported_parameter', 'modalities');
    await expectApiError(client.chat.completions.create({ ...greedy, messages: user('Hi'), temprature: 1 }), 400, 'unknown_parameter', 'temprature');
    await expectApiError(client.chat.completions.create({ ...greedy, messages: user('Hi'), top_logprobs: 50, logprobs: true }),
      400, 'invalid_request_error', 'top_logprobs');
    await expectApiError(client.chat.completions.create({ ...greedy, messages: user('Hi'), n: 1000 }), 400, 'invalid_request_error', 'n');
    await expectApiError(client.completions.create({ model, prompt: ['a', 'b'] }), 400, 'unsupported_parameter', 'prompt');
  },
};

await runChecks(checks, process.argv.slice(3));
