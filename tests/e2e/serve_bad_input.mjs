// The bad-input table: each row is one malformed or refused request against a real `qvl serve`,
// with the HTTP status and the error message it must get, OpenAI-shaped
// ({"error":{"message","type","param","code"}}). After all rows the server must still be healthy
// and answer a good request. A few rows also go through the official openai client to check
// that it raises the matching error class with our message.
// Usage: node serve_bad_input.mjs URL API_KEY SCRATCH_DIR   (server flags: see serve_bad_input.sh)
import { symlinkSync, writeFileSync, mkdirSync } from 'node:fs';
import { client, check, eq, step, finish, png, dataUri, openaiErrors } from './lib/common.mjs';

const [url, apiKey, scratch] = process.argv.slice(2);
const auth = { Authorization: `Bearer ${apiKey}`, 'Content-Type': 'application/json' };
const media = `${scratch}/media`;  // the server's --allowed-media-dir

mkdirSync(media, { recursive: true });
writeFileSync(`${media}/ok.png`, png(40, 30, 1));
writeFileSync(`${scratch}/outside.png`, png(40, 30, 2));
symlinkSync(`${scratch}/outside.png`, `${media}/escape.png`);

// A baseline grayscale 16x16 JPEG whose header is complete and whose entropy-coded data is
// missing: the header probes fine, decoding runs out of data.
function truncatedJpeg() {
  const seg = (marker, body) => Buffer.concat([Buffer.from([0xff, marker, (body.length + 2) >> 8, (body.length + 2) & 0xff]), body]);
  const bits = (n) => { const b = Buffer.alloc(16); b[0] = n; return b; };  // n codes of length 1
  return Buffer.concat([
    Buffer.from([0xff, 0xd8]),                                               // SOI
    seg(0xdb, Buffer.concat([Buffer.from([0x00]), Buffer.alloc(64, 1)])),    // DQT: table 0, all ones
    seg(0xc0, Buffer.from([8, 0, 16, 0, 16, 1, 1, 0x11, 0])),                // SOF0: 8-bit 16x16, 1 comp
    seg(0xc4, Buffer.concat([Buffer.from([0x00]), bits(1), Buffer.from([0])])),  // DHT DC0: one code
    seg(0xc4, Buffer.concat([Buffer.from([0x10]), bits(1), Buffer.from([0])])),  // DHT AC0: EOB only
    seg(0xda, Buffer.from([1, 1, 0x00, 0, 63, 0])),                         // SOS, then nothing
  ]);
}

const goodPng = png(64, 48, 3);
const bigPng = png(400, 300, 4);  // 120000 pixels, over --max-image-input-pixels 100000
const user = (content) => ({ messages: [{ role: 'user', content }] });
const img = (u) => ({ type: 'image_url', image_url: { url: u } });
const body = (o) => JSON.stringify(o);

const rows = [
  { name: 'invalid JSON', raw: '{"messages": [', status: 400,
    message: /^request body is not valid JSON: parse error at line 1, column 15: /, param: null },
  { name: 'wrong type: messages is a string', json: { messages: 'hi' }, status: 400,
    message: 'messages must be an array, got string', param: 'messages' },
  { name: 'wrong type: temperature is a string', json: { ...user('hi'), temperature: 'hot' }, status: 400,
    message: 'temperature must be a number, got string', param: 'temperature' },
  { name: 'wrong type: stream is a number', json: { ...user('hi'), stream: 1 }, status: 400,
    message: 'stream must be a boolean, got integer', param: 'stream' },
  { name: 'missing messages', json: { model: 'tiny' }, status: 400, message: 'messages is required', param: 'messages' },
  { name: 'unknown model', json: { model: 'gpt-4o', ...user('hi') }, status: 404,
    message: "the model 'gpt-4o' does not exist; this server serves 'tiny'", code: 'model_not_found' },
  { name: 'bad base64', json: user([img('data:image/png;base64,iVBORw0KGgo!!!!')]), status: 400,
    message: "messages[0].content[0].image_url: data URI: invalid base64: '!' at offset 11",
    param: 'messages[0].content[0].image_url' },
  { name: 'not an image', json: user([img(dataUri(Buffer.from('this is plain text, not a picture')))]), status: 400,
    message: /^messages\[0\]\.content\[0\]\.image_url: unrecognised image data \(33 bytes, starting /,
    param: 'messages[0].content[0].image_url' },
  { name: 'truncated JPEG', json: user([img(dataUri(truncatedJpeg(), 'image/jpeg'))]), status: 400,
    message: /^messages\[0\]\.content\[0\]\.image_url: JPEG: data is truncated/,
    param: 'messages[0].content[0].image_url' },
  { name: 'truncated PNG', json: user([img(dataUri(goodPng.subarray(0, goodPng.length - 40)))]), status: 400,
    message: /^messages\[0\]\.content\[0\]\.image_url: PNG: / },
  { name: 'image over the pixel limit', json: user([{ type: 'text', text: 'see' }, img(dataUri(bigPng))]), status: 400,
    message: 'messages[0].content[1].image_url: image is 400x300 = 120000 pixels; the limit is 100000 ' +
      '(--max-image-input-pixels)' },
  { name: 'too many images', json: user([img(dataUri(goodPng)), img(dataUri(goodPng)), img(dataUri(goodPng))]),
    status: 400, message: 'request has 3 images; the limit is 2 (--max-images-per-request)', code: 'too_many_images' },
  { name: 'prompt over the context', json: user('lorem ipsum '.repeat(400)), status: 400,
    message: /^this model's maximum context length is 512 tokens; the messages have \d+ \(of which 0 image tokens\), leaving no room for a completion$/,
    code: 'context_length_exceeded' },
  { name: 'prompt plus max_tokens over the context', json: { ...user('hi'), max_tokens: 600 }, status: 400,
    message: /^this model's maximum context length is 512 tokens; the request needs \d+ \(\d+ in the messages, of which 0 image tokens, and 600 for the completion\)/,
    code: 'context_length_exceeded' },
  { name: 'negative max_tokens', json: { ...user('hi'), max_tokens: -5 }, status: 400,
    message: 'max_tokens must be at least 1, got -5', param: 'max_tokens' },
  { name: 'temperature out of range', json: { ...user('hi'), temperature: 3 }, status: 400,
    message: 'temperature must be in [0, 2], got 3', param: 'temperature' },
  { name: 'n > 1', json: { ...user('hi'), n: 2 }, status: 400,
    message: 'n must be 1 (this server returns one choice per request), got 2', param: 'n' },
  { name: 'unknown content part type', json: user([{ type: 'video', video: 'x' }]), status: 400,
    message: "messages[0].content[0].type must be one of text, image_url, got 'video'",
    param: 'messages[0].content[0].type' },
  { name: 'a path outside the allowed directory', json: user([img('file:///etc/passwd')]), status: 400,
    message: "messages[0].content[0].image_url: image file '/etc/passwd' is outside the allowed media directory " +
      '(--allowed-media-dir)' },
  { name: 'a symlink out of the allowed directory', json: user([img(`file://${media}/escape.png`)]), status: 400,
    message: `messages[0].content[0].image_url: image file '${media}/escape.png' is outside the allowed media ` +
      'directory (--allowed-media-dir)' },
  { name: 'a .. path out of the allowed directory', json: user([img(`file://${media}/../outside.png`)]), status: 400,
    message: `messages[0].content[0].image_url: image file '${media}/../outside.png' is outside the allowed media ` +
      'directory (--allowed-media-dir)' },
  { name: 'a URL when fetching is off', json: user([img('http://127.0.0.1:9/cat.png')]), status: 400,
    message: "messages[0].content[0].image_url: image URL 'http://127.0.0.1:9/cat.png' refused: fetching http(s) " +
      'image URLs is disabled on this server (start it with --allow-url-fetch), send the image as a data: URI instead' },
  { name: 'an oversized body', raw: body({ ...user('x'.repeat(2 << 20)) }), status: 413,
    message: `request body of ${body({ ...user('x'.repeat(2 << 20)) }).length} bytes exceeds the limit of 1048576 bytes (--max-body-bytes)`,
    code: 'request_too_large' },
  { name: 'a wrong API key', json: user('hi'), headers: { Authorization: 'Bearer not-the-key' }, status: 401,
    message: 'incorrect API key provided', code: 'invalid_api_key' },
  { name: 'no API key', json: user('hi'), headers: { Authorization: '' }, status: 401,
    message: "missing API key: send the header 'Authorization: Bearer <key>'", code: 'invalid_api_key' },
];

function matches(actual, expected) {
  return expected instanceof RegExp ? expected.test(actual) : actual === expected;
}

for (const row of rows) {
  await step(`${row.status} for ${row.name}`, async () => {
    const headers = { ...auth, ...(row.headers || {}) };
    if (headers.Authorization === '') delete headers.Authorization;
    const r = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST', headers, body: row.raw ?? body({ model: 'tiny', ...row.json }),
    });
    const text = await r.text();
    eq(r.status, row.status, `status (body ${text.slice(0, 300)})`);
    check((r.headers.get('content-type') || '').startsWith('application/json'), 'JSON error body');
    const j = JSON.parse(text);
    check(j.error && typeof j.error === 'object', 'has an error object');
    eq(Object.keys(j.error).sort(), ['code', 'message', 'param', 'type'], 'error fields');
    check(matches(j.error.message, row.message), `message ${JSON.stringify(j.error.message)} does not match ${row.message}`);
    eq(j.error.type, row.status >= 500 ? 'server_error' : 'invalid_request_error', 'type');
    if ('param' in row) eq(j.error.param, row.param, 'param');
    if (row.code) eq(j.error.code, row.code, 'code');
  });
}

await step('the openai client raises BadRequestError / AuthenticationError / NotFoundError with our message', async () => {
  const good = client(url, apiKey);
  const expectError = async (cls, params, message, c = good) => {
    try {
      await c.chat.completions.create(params);
    } catch (e) {
      check(e instanceof cls, `expected ${cls.name}, got ${e.constructor.name}: ${e.message}`);
      eq(e.error?.message, message, 'error.message');
      return;
    }
    throw new Error(`no error for ${JSON.stringify(params).slice(0, 200)}`);
  };
  await expectError(openaiErrors.BadRequestError, { model: 'tiny', ...user('hi'), temperature: 3 },
    'temperature must be in [0, 2], got 3');
  await expectError(openaiErrors.NotFoundError, { model: 'nope', ...user('hi') },
    "the model 'nope' does not exist; this server serves 'tiny'");
  await expectError(openaiErrors.AuthenticationError, { model: 'tiny', ...user('hi') }, 'incorrect API key provided',
    client(url, 'wrong'));
});

await step('still healthy: /health 200 and a good request with an image (data URI and file://) is answered', async () => {
  const h = await fetch(`${url}/health`);
  eq(h.status, 200, '/health');
  const r = await client(url, apiKey).chat.completions.create({
    model: 'tiny', max_tokens: 4, ...user([img(dataUri(goodPng)), img(`file://${media}/ok.png`), { type: 'text', text: 'Compare.' }]),
  });
  check(r.choices[0].message.content !== undefined, 'answer');
  check(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 4, 'completion tokens');
});

finish();
