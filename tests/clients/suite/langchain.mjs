// LangChain JS 1.x (@langchain/openai's ChatOpenAI and OpenAIEmbeddings, @langchain/core) against
// towerd over chat completions and embeddings. Issue 23, "How it is checked".
import assert from 'node:assert/strict';
import { HumanMessage, ToolMessage } from '@langchain/core/messages';
import { tool } from '@langchain/core/tools';
import { ChatOpenAI, OpenAIEmbeddings } from '@langchain/openai';
import { z } from 'zod';
import { assertUnit, baseURL, fetchOverSocket, modelId, sameVector } from './towerd.mjs';

const configuration = { baseURL, fetch: fetchOverSocket };
const llm = (fields = {}) => new ChatOpenAI({ model: modelId, apiKey: 'unused', configuration, maxRetries: 0, maxTokens: 12, ...fields });

const getWeather = tool(async ({ city }) => `18 degrees in ${city}`, {
  name: 'get_weather', description: 'The weather in a city', schema: z.object({ city: z.string().max(12) }),
});

export const checks = {
  async langchain_invoke() {
    const m = await llm({ temperature: 0 }).invoke('Once upon a time');
    assert.equal(typeof m.content, 'string');
    assert.ok(m.content.length > 0);
    assert.ok(m.usage_metadata.input_tokens > 0 && m.usage_metadata.output_tokens <= 12, JSON.stringify(m.usage_metadata));
  },

  // Streamed chunks add up to the reply the same seeded request gets whole.
  async langchain_stream() {
    const model = llm({ temperature: 1, maxTokens: 16 }).withConfig({ seed: 21 });  // seed is a call option
    const whole = await model.invoke('Once upon a time');
    let text = '';
    let chunks = 0;
    let usage;
    for await (const c of await model.stream('Once upon a time')) {
      text += c.content;
      chunks++;
      usage = c.usage_metadata ?? usage;
    }
    assert.ok(chunks > 1);
    assert.equal(text, whole.content);
    assert.equal(usage.output_tokens, whole.usage_metadata.output_tokens);
  },

  // bindTools with a required call, the tool run on its arguments, then a ToolMessage (which
  // LangChain sends with `name`) answered in the same conversation.
  async langchain_tool_round_trip() {
    const model = llm({ temperature: 1, maxTokens: 150 });
    const question = new HumanMessage({ content: 'What is the weather in Paris?', name: 'alice' });
    const ai = await model.bindTools([getWeather], { tool_choice: 'required' }).invoke([question], { seed: 5 });
    assert.ok(ai.tool_calls.length >= 1, JSON.stringify(ai));
    const [call] = ai.tool_calls;
    assert.equal(call.name, 'get_weather');
    assert.equal(typeof call.args.city, 'string');
    const result = await getWeather.invoke(call);  // a ToolMessage, name and tool_call_id set
    assert.ok(result instanceof ToolMessage);
    assert.equal(result.name, 'get_weather');
    const answers = ai.tool_calls.slice(1).map((c) => new ToolMessage({ content: 'unknown', tool_call_id: c.id, name: c.name }));
    const final = await model.bindTools([getWeather]).invoke([question, ai, result, ...answers], { tool_choice: 'none', seed: 5 });
    assert.equal(final.tool_calls.length, 0);
    assert.ok(final.content.length > 0);
  },

  // withStructuredOutput: the default method (json_schema) and function calling (a named tool).
  async langchain_structured_output() {
    const schema = z.object({ name: z.string().max(10), age: z.number().int().min(0).max(99), mood: z.enum(['happy', 'sad']) });
    for (const method of ['jsonSchema', 'functionCalling']) {
      const out = await llm({ temperature: 1, maxTokens: 150 }).withStructuredOutput(schema, { method }).invoke('A person', { seed: 4 });
      assert.ok(typeof out.name === 'string' && out.name.length <= 10, `${method}: ${JSON.stringify(out)}`);
      assert.ok(Number.isInteger(out.age) && out.age >= 0 && out.age <= 99, `${method}: ${JSON.stringify(out)}`);
      assert.ok(['happy', 'sad'].includes(out.mood));
    }
  },

  async langchain_embeddings() {
    const embeddings = new OpenAIEmbeddings({ model: modelId, apiKey: 'unused', configuration, maxRetries: 0 });
    const query = await embeddings.embedQuery('Once upon a time');
    assert.ok(query.length > 0);
    assertUnit(query, query.length);
    const docs = await embeddings.embedDocuments(['The cat', 'Once upon a time']);
    assert.equal(docs.length, 2);
    assert.ok(sameVector(docs[1], query));
    assert.ok(!sameVector(docs[0], query));
  },
};
