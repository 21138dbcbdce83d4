// Load on loopback against a real `qvl serve --model tiny`: 16 concurrent clients x 200 requests,
// a mix of non-streamed, streamed and abandoned requests (the client disconnects after the first
// content chunk of a stream, or 15 ms into a non-streamed request), some with an image. Passes when there is no 5xx and no
// transport error, every completed response is well-formed, the server ends idle (nothing
// running or queued, no KV pages held), its resident memory after the run is within 10% of
// what it was after a warm-up of the same mix, and its thread count is unchanged.
// Usage: node serve_load.mjs URL SERVER_PID [CLIENTS] [REQUESTS_PER_CLIENT]
import { client, check, eq, step, finish, png, dataUri, metrics, procStatus, sleep } from './lib/common.mjs';

const [url, pidArg, clientsArg, perClientArg] = process.argv.slice(2);
const pid = Number(pidArg);
const CLIENTS = Number(clientsArg || 16);
const PER_CLIENT = Number(perClientArg || 200);
const WARMUP_PER_CLIENT = 12;
const image = dataUri(png(48, 40, 5));

const stats = { done: 0, streamed: 0, abandoned: 0, hungUp: 0, errors: [] };

function request(c, i) {
  const kind = (c * 7 + i) % 8;
  const withImage = (c + i) % 10 === 0;
  const text = `client ${c} request ${i}: ${'describe the scene '.repeat(1 + (i % 4))}`;
  const content = withImage ? [{ type: 'image_url', image_url: { url: image } }, { type: 'text', text }] : text;
  const params = { model: 'tiny', messages: [{ role: 'user', content }], max_tokens: 1 + ((c + i) % 6), seed: i };
  if (kind < 4) return { kind: 'plain', params };
  if (kind < 7) return { kind: 'stream', params: { ...params, stream: true, stream_options: { include_usage: true } } };
  // Abandoned: a stream dropped after its first content chunk, or (every other time) a
  // non-streamed request dropped while it generates.
  const long = { ...params, max_tokens: 64, ignore_eos: true };
  return Math.floor(i / 8) % 2 ? { kind: 'abandon', params: { ...long, stream: true } } : { kind: 'hangup', params: long };
}

function checkUsage(u, maxTokens, what) {
  check(u && Number.isInteger(u.prompt_tokens) && u.prompt_tokens > 0, `${what}: prompt_tokens`);
  check(u.completion_tokens >= 0 && u.completion_tokens <= maxTokens, `${what}: completion_tokens ${u.completion_tokens}`);
  eq(u.total_tokens, u.prompt_tokens + u.completion_tokens, `${what}: total_tokens`);
}

async function one(openai, c, i) {
  const { kind, params } = request(c, i);
  const what = `client ${c} request ${i} (${kind})`;
  try {
    if (kind === 'plain') {
      const r = await openai.chat.completions.create(params);
      eq(r.object, 'chat.completion', `${what}: object`);
      check(typeof r.choices[0].message.content === 'string', `${what}: content`);
      check(['stop', 'length'].includes(r.choices[0].finish_reason), `${what}: finish_reason`);
      checkUsage(r.usage, params.max_tokens, what);
    } else if (kind === 'stream') {
      const stream = await openai.chat.completions.create(params);
      const chunks = [];
      for await (const ch of stream) chunks.push(ch);
      check(chunks.length >= 3, `${what}: ${chunks.length} chunks`);
      eq(chunks[0].choices[0].delta.role, 'assistant', `${what}: role chunk`);
      const fin = chunks[chunks.length - 2].choices[0].finish_reason;
      check(['stop', 'length'].includes(fin), `${what}: finish_reason ${fin}`);
      eq(chunks[chunks.length - 1].choices, [], `${what}: usage chunk`);
      checkUsage(chunks[chunks.length - 1].usage, params.max_tokens, what);
      stats.streamed++;
    } else if (kind === 'hangup') {
      const ac = new AbortController();
      setTimeout(() => ac.abort(), 15);
      try {
        await openai.chat.completions.create(params, { signal: ac.signal });
      } catch (e) {
        if (!(e.constructor?.name || '').includes('Abort') && e.name !== 'AbortError') throw e;
      }
      stats.abandoned++;
      stats.hungUp++;
    } else {
      const ac = new AbortController();
      const stream = await openai.chat.completions.create(params, { signal: ac.signal });
      try {
        for await (const ch of stream) {
          if (ch.choices[0]?.delta?.content !== undefined && !ch.choices[0].delta.role) {
            ac.abort();
            break;
          }
        }
      } catch (e) {
        if (e.name !== 'AbortError' && !(e.constructor?.name || '').includes('Abort')) throw e;
      }
      stats.abandoned++;
    }
    stats.done++;
  } catch (e) {
    stats.errors.push(`${what}: ${e.status ? `HTTP ${e.status} ` : ''}${e.message}`);
  }
}

async function run(perClient, label) {
  const t0 = Date.now();
  await Promise.all(Array.from({ length: CLIENTS }, async (_, c) => {
    const openai = client(url);  // one client (and keep-alive connection pool) per simulated user
    for (let i = 0; i < perClient; i++) await one(openai, c, i);
  }));
  console.log(`# ${label}: ${CLIENTS} x ${perClient} requests in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
}

// Waits until the engine is idle (abandoned streams are cancelled within a step or so).
async function idle() {
  let m;
  for (let i = 0; i < 200; i++) {
    m = await metrics(url);
    if (m.qvl_num_requests_running === 0 && m.qvl_num_requests_waiting === 0 && m.qvl_kv_pages_used === 0) return m;
    await sleep(50);
  }
  throw new Error(`not idle after 10 s: running ${m.qvl_num_requests_running}, waiting ${m.qvl_num_requests_waiting}, ` +
    `kv pages ${m.qvl_kv_pages_used}`);
}

await run(WARMUP_PER_CLIENT, 'warm-up');
await idle();
await sleep(500);  // idle keep-alive connections settle
const warm = procStatus(pid);
const before = await metrics(url);
console.log(`# after warm-up: VmRSS ${warm.rssKb} kB, ${warm.threads} threads`);

stats.done = stats.streamed = stats.abandoned = stats.hungUp = 0;
stats.errors = [];
await run(PER_CLIENT, 'load');

await step(`every request completed without a 5xx or a transport error (${CLIENTS * PER_CLIENT} requests)`, async () => {
  check(stats.errors.length === 0, `${stats.errors.length} failures, first ones:\n  ${stats.errors.slice(0, 10).join('\n  ')}`);
  eq(stats.done, CLIENTS * PER_CLIENT, 'completed');
  check(stats.streamed > 0 && stats.hungUp > 0 && stats.abandoned > stats.hungUp,
    'the mix had streamed, abandoned streamed and abandoned non-streamed requests');
});

let after;
await step('the server ends idle: nothing running or queued, no KV pages held', async () => {
  after = await idle();
});

await step('no 5xx in the server\'s own counters during the run; abandoned streams were cancelled', async () => {
  // Deltas over the run: /health answered 503 while the model loaded, before it.
  for (const [k, v] of Object.entries(after)) {
    const s = /^qvl_http_requests_total\{endpoint="[a-z_]+",status="(\d+)"\}$/.exec(k);
    if (s && Number(s[1]) >= 500 && v !== (before[k] || 0)) throw new Error(`${k} went from ${before[k] || 0} to ${v}`);
  }
  const key = 'qvl_request_finished_total{finish_reason="cancelled"}';
  const cancelled = (after[key] || 0) - (before[key] || 0);
  check(cancelled >= 1 && cancelled <= stats.abandoned, `cancelled ${cancelled} of ${stats.abandoned} abandoned`);
  console.log(`# ${cancelled} of ${stats.abandoned} abandoned requests (${stats.hungUp} not streamed) were cancelled ` +
    'mid-generation');
});

await step('resident memory within 10% of after warm-up; thread count unchanged', async () => {
  await sleep(500);
  const now = procStatus(pid);
  console.log(`# after load: VmRSS ${now.rssKb} kB (${((now.rssKb / warm.rssKb - 1) * 100).toFixed(1)}%), ${now.threads} threads`);
  check(now.rssKb <= warm.rssKb * 1.10, `VmRSS ${now.rssKb} kB > 110% of ${warm.rssKb} kB`);
  eq(now.threads, warm.threads, 'threads');
});

finish();
