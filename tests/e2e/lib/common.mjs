// Shared helpers for the server e2e scripts: the official openai client from npm/node_modules,
// a small PNG encoder (test images are generated, not committed), Prometheus text parsing,
// /proc readings, and a step runner that prints one line per check and fails loudly.
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import zlib from 'node:zlib';

const modules = process.env.QVL_NODE_MODULES;
if (!modules) throw new Error('QVL_NODE_MODULES is not set (run through tests/e2e/*.sh)');
const require = createRequire(`${modules}/`);
export const OpenAI = require('openai').OpenAI ?? require('openai');
export const openaiErrors = require('openai');

// A client that never retries, so a 5xx or 429 is seen as it is.
export function client(baseURL, apiKey = 'unused') {
  return new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 120000 });
}

let failures = 0;
export async function step(name, fn) {
  try {
    await fn();
    console.log(`ok - ${name}`);
  } catch (e) {
    failures++;
    console.log(`not ok - ${name}\n  ${(e && e.stack) || e}`);
  }
}
export function finish() {
  if (failures) {
    console.log(`${failures} check(s) failed`);
    process.exit(1);
  }
  console.log('all checks passed');
}

export function check(cond, message) {
  if (!cond) throw new Error(message);
}
export function eq(actual, expected, what) {
  const a = JSON.stringify(actual);
  const b = JSON.stringify(expected);
  if (a !== b) throw new Error(`${what}: got ${a}, expected ${b}`);
}

// --- PNG encoding (RGB8, filter 0) -------------------------------------------------------------
const crcTable = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});
function crc32(buf) {
  let c = 0xffffffff;
  for (const b of buf) c = crcTable[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}
function chunk(type, data) {
  const len = Buffer.alloc(4);
  len.writeUInt32BE(data.length);
  const body = Buffer.concat([Buffer.from(type, 'ascii'), data]);
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(body));
  return Buffer.concat([len, body, crc]);
}
// A deterministic gradient-and-stripes picture, so different sizes give different images.
export function png(width, height, seed = 1) {
  const raw = Buffer.alloc(height * (1 + width * 3));
  for (let y = 0; y < height; y++) {
    const row = y * (1 + width * 3);
    raw[row] = 0;
    for (let x = 0; x < width; x++) {
      const i = row + 1 + x * 3;
      raw[i] = (x * 255 / Math.max(1, width - 1) + seed * 40) & 0xff;
      raw[i + 1] = (y * 255 / Math.max(1, height - 1)) & 0xff;
      raw[i + 2] = ((x >> 3) + (y >> 3) + seed) % 2 ? 200 : 30;
    }
  }
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr[8] = 8;  // bit depth
  ihdr[9] = 2;  // colour type RGB
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk('IHDR', ihdr),
    chunk('IDAT', zlib.deflateSync(raw)),
    chunk('IEND', Buffer.alloc(0)),
  ]);
}
export function dataUri(bytes, mime = 'image/png') {
  return `data:${mime};base64,${Buffer.from(bytes).toString('base64')}`;
}

// --- Prometheus text ----------------------------------------------------------------------------
// {"name{labels}": value} for every sample line.
export function parseMetrics(text) {
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const sp = line.lastIndexOf(' ');
    out[line.slice(0, sp)] = Number(line.slice(sp + 1));
  }
  return out;
}
export async function metrics(baseURL) {
  const r = await fetch(`${baseURL}/metrics`);
  check(r.status === 200, `/metrics answered ${r.status}`);
  check((r.headers.get('content-type') || '').startsWith('text/plain'), 'metrics content type');
  return parseMetrics(await r.text());
}

// --- /proc ----------------------------------------------------------------------------------------
export function procStatus(pid) {
  const text = readFileSync(`/proc/${pid}/status`, 'utf8');
  const field = (name) => Number((text.match(new RegExp(`^${name}:\\s+(\\d+)`, 'm')) || [])[1]);
  return { rssKb: field('VmRSS'), threads: field('Threads') };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
