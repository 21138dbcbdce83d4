// Shared by the node examples: the client, the served model, and a file -> data: URI helper.
import OpenAI from 'openai';
import { readFileSync } from 'node:fs';
import { extname } from 'node:path';

export const client = new OpenAI({
  baseURL: process.env.QVL_BASE_URL ?? 'http://127.0.0.1:8000/v1',
  apiKey: process.env.QVL_API_KEY ?? 'none',
});

export async function servedModel() {
  if (process.env.QVL_MODEL) return process.env.QVL_MODEL;
  const models = await client.models.list();
  return models.data[0].id;
}

const mimeTypes = { '.png': 'image/png', '.webp': 'image/webp', '.jpg': 'image/jpeg', '.jpeg': 'image/jpeg' };
export function dataUri(path) {
  const mime = mimeTypes[extname(path).toLowerCase()] ?? 'image/jpeg';
  return `data:${mime};base64,${readFileSync(path).toString('base64')}`;
}
