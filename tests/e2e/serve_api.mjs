// The OpenAI API of `qvl serve --model tiny`, through the official openai npm client:
// non-streamed and streamed chat with a data-URI image, usage, stop strings, seed determinism,
// the same tokens as `qvl run --json` for the same input, /v1/models, /health, /metrics.
// Usage: node serve_api.mjs URL QVL_BINARY SCRATCH_DIR SERVED_MODEL_NAME
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { client, check, eq, step, finish, png, dataUri, metrics } from './lib/common.mjs';

const [url, qvl, scratch, modelName] = process.argv.slice(2);
const openai = client(url);
const image = png(64, 48, 3);
const imagePath = `${scratch}/picture.png`;
writeFileSync(imagePath, image);
const question = 'What is in this picture?';
const userTurn = [
  { type: 'image_url', image_url: { url: dataUri(image) } },
  { type: 'text', text: question },
];
const MAX = 12;

// What the test itself asked for, to check the counters at the end.
const ledger = { ok: 0, promptTokens: 0, completionTokens: 0 };
function account(usage) {
  ledger.ok++;
  ledger.promptTokens += usage.prompt_tokens;
  ledger.completionTokens += usage.completion_tokens;
}

async function collectStream(params) {
  const stream = await openai.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

let greedy;  // the non-streamed greedy answer, reused below

await step('GET /health is 200 {"status":"ok"}', async () => {
  const r = await fetch(`${url}/health`);
  eq(r.status, 200, 'status');
  eq(await r.json(), { status: 'ok' }, 'body');
});

await step('/v1/models lists the served model', async () => {
  const page = await openai.models.list();
  const ids = page.data.map((m) => m.id);
  eq(ids, [modelName], 'model ids');
  eq(page.data[0].object, 'model', 'object');
  check(page.data[0].max_model_len > 0, 'max_model_len is positive');
  const one = await openai.models.retrieve(modelName);
  eq(one.id, modelName, 'retrieve');
});

await step('non-streamed chat with a data-URI image: shape, usage, token ids', async () => {
  const r = await openai.chat.completions.create({
    model: modelName, messages: [{ role: 'user', content: userTurn }], temperature: 0, max_tokens: MAX,
    return_token_ids: true,
  });
  eq(r.object, 'chat.completion', 'object');
  check(/^chatcmpl-[0-9a-f]{24}$/.test(r.id), `id ${r.id}`);
  eq(r.model, modelName, 'model');
  check(Number.isInteger(r.created) && Math.abs(r.created - Date.now() / 1000) < 600, 'created is now');
  eq(r.choices.length, 1, 'choices');
  const c = r.choices[0];
  eq(c.index, 0, 'index');
  eq(c.message.role, 'assistant', 'role');
  check(typeof c.message.content === 'string', 'content is a string');
  check(['stop', 'length'].includes(c.finish_reason), `finish_reason ${c.finish_reason}`);
  eq(r.usage.prompt_tokens, r.prompt_token_ids.length, 'prompt_tokens = prompt ids');
  eq(r.usage.completion_tokens, c.token_ids.length, 'completion_tokens = generated ids');
  eq(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens, 'total_tokens');
  if (c.finish_reason === 'length') eq(c.token_ids.length, MAX, 'length finish uses max_tokens');
  check(r.usage.prompt_tokens > 20, 'the image contributes pad tokens to the prompt');
  greedy = r;
  account(r.usage);
});

await step('streamed chat: role chunk, deltas, finish chunk, usage chunk; same as non-streamed', async () => {
  const chunks = await collectStream({
    model: modelName, messages: [{ role: 'user', content: userTurn }], temperature: 0, max_tokens: MAX,
    return_token_ids: true,
  });
  check(chunks.length >= 3, `only ${chunks.length} chunks`);
  const first = chunks[0];
  eq(first.object, 'chat.completion.chunk', 'object');
  eq(first.choices[0].delta.role, 'assistant', 'first delta role');
  for (const c of chunks) eq(c.id, first.id, 'one id for all chunks');
  const usageChunk = chunks[chunks.length - 1];
  eq(usageChunk.choices, [], 'usage chunk has no choices');
  const finishChunk = chunks[chunks.length - 2];
  eq(finishChunk.choices[0].finish_reason, greedy.choices[0].finish_reason, 'finish_reason');
  let text = '';
  const ids = [];
  for (const c of chunks.slice(0, -1)) {
    eq(c.usage, null, 'usage is null on content chunks');
    const ch = c.choices[0];
    if (c !== finishChunk) eq(ch.finish_reason, null, 'finish_reason null before the end');
    text += ch.delta.content ?? '';
    ids.push(...(ch.token_ids ?? []));
  }
  eq(text, greedy.choices[0].message.content, 'streamed text = non-streamed text');
  eq(ids, greedy.choices[0].token_ids, 'streamed ids = non-streamed ids');
  eq(usageChunk.usage, greedy.usage, 'usage');
  account(usageChunk.usage);
});

await step('the same tokens as `qvl run --json` for the same input', async () => {
  const out = execFileSync(qvl, ['run', 'tiny', '--image', imagePath, '--prompt', question, '--temperature', '0',
    '--max-tokens', String(MAX), '--json'], { encoding: 'utf8', env: process.env, maxBuffer: 64 << 20 });
  const run = JSON.parse(out);
  eq(run.prompt_token_ids, greedy.prompt_token_ids, 'prompt ids (chat template, image pads)');
  eq(run.token_ids, greedy.choices[0].token_ids, 'generated ids');
  eq(run.text, greedy.choices[0].message.content, 'text');
  eq(run.finish_reason, greedy.choices[0].finish_reason, 'finish_reason');
});

await step('stop strings end the text before the stop string, finish_reason stop', async () => {
  const text = greedy.choices[0].message.content;
  // A stop string taken from inside the greedy answer (not at its start): generation is the
  // same up to it, so the answer must be exactly the text before its first occurrence.
  const chars = [...text];
  check(chars.length >= 4, `greedy answer too short for a stop test: ${JSON.stringify(text)}`);
  const start = Math.floor(chars.length / 2);
  const stop = chars.slice(start, start + 2).join('');
  const expected = text.slice(0, text.indexOf(stop));
  for (const stream of [false, true]) {
    const params = { model: modelName, messages: [{ role: 'user', content: userTurn }], temperature: 0,
      max_tokens: MAX, stop: [stop, '\u0000never'] };
    let content, finishReason, usage;
    if (stream) {
      const chunks = await collectStream(params);
      content = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
      finishReason = chunks[chunks.length - 2].choices[0].finish_reason;
      usage = chunks[chunks.length - 1].usage;
    } else {
      const r = await openai.chat.completions.create(params);
      content = r.choices[0].message.content;
      finishReason = r.choices[0].finish_reason;
      usage = r.usage;
    }
    eq(content, expected, `text before stop ${JSON.stringify(stop)} (stream=${stream})`);
    eq(finishReason, 'stop', `finish_reason (stream=${stream})`);
    check(usage.completion_tokens <= greedy.usage.completion_tokens, 'stopped no later than the full answer');
    account(usage);
  }
});

await step('seed: same seed -> same tokens; another seed -> other tokens', async () => {
  const ask = async (seed) => {
    const r = await openai.chat.completions.create({
      model: modelName, messages: [{ role: 'user', content: 'Tell me a story.' }], temperature: 1.0, top_p: 1,
      top_k: 0, seed, max_tokens: 16, ignore_eos: true, return_token_ids: true,
    });
    account(r.usage);
    eq(r.choices[0].finish_reason, 'length', 'ignore_eos runs to max_tokens');
    eq(r.usage.completion_tokens, 16, 'completion tokens');
    return r.choices[0].token_ids;
  };
  const a = await ask(1234);
  const b = await ask(1234);
  const c = await ask(4321);
  eq(b, a, 'seed 1234 twice');
  check(JSON.stringify(c) !== JSON.stringify(a), 'seed 4321 gave the same 16 tokens as seed 1234');
});

await step('string content and max_completion_tokens', async () => {
  const r = await openai.chat.completions.create({
    model: modelName, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello!' }],
    max_completion_tokens: 3, ignore_eos: true,
  });
  eq(r.usage.completion_tokens, 3, 'max_completion_tokens');
  eq(r.choices[0].finish_reason, 'length', 'finish_reason');
  account(r.usage);
});

await step('/metrics counts exactly what this script did', async () => {
  // httplib counts a request just after its response is written: give it a moment.
  await new Promise((r) => setTimeout(r, 300));
  const m = await metrics(url);
  eq(m['qvl_http_requests_total{endpoint="chat_completions",status="200"}'], ledger.ok, 'chat 200s');
  eq(m.qvl_prompt_tokens_total, ledger.promptTokens, 'prompt tokens');
  eq(m.qvl_generation_tokens_total, ledger.completionTokens, 'generated tokens');
  eq(m.qvl_time_to_first_token_seconds_count, ledger.ok, 'one TTFT per request');
  eq(m['qvl_time_to_first_token_seconds_bucket{le="+Inf"}'], ledger.ok, 'TTFT +Inf bucket');
  eq(m.qvl_e2e_request_latency_seconds_count, ledger.ok, 'e2e latency count');
  // Every token after the first of each request has an inter-token interval.
  check(m.qvl_inter_token_latency_seconds_count <= ledger.completionTokens - ledger.ok + 1e-9, 'ITL count');
  check(m.qvl_inter_token_latency_seconds_count > 0, 'ITL observed');
  eq(m.qvl_model_loaded, 1, 'model_loaded');
  eq(m.qvl_requests_in_flight, 0, 'nothing in flight');
  eq(m.qvl_num_requests_running, 0, 'nothing running');
  eq(m.qvl_num_requests_waiting, 0, 'nothing waiting');
  eq(m.qvl_kv_pages_used, 0, 'no KV pages held');
  check(m.qvl_kv_pages_free > 0, 'free KV pages');
  check(m['qvl_http_requests_total{endpoint="health",status="200"}'] >= 1, 'health counted');
});

finish();
