// Analyse a scene and stream the answer as it is generated, through the openai npm client.
//   node scene.mjs street.jpg
// Environment: QVL_BASE_URL (default http://127.0.0.1:8000/v1), QVL_API_KEY, QVL_MODEL.
import { client, servedModel, dataUri } from './common.mjs';

const prompt = 'Analyse this scene. List: 1) the setting and time of day, 2) the main objects and people ' +
  'with where they are, 3) what is happening, 4) anything unusual or hazardous.';
const stream = await client.chat.completions.create({
  model: await servedModel(),
  messages: [{ role: 'user', content: [
    { type: 'image_url', image_url: { url: dataUri(process.argv[2]) } },
    { type: 'text', text: prompt },
  ] }],
  max_tokens: 512,
  stream: true,
  stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  const text = chunk.choices[0]?.delta?.content;
  if (text) process.stdout.write(text);
  if (chunk.usage) console.error(`\n[${chunk.usage.prompt_tokens} prompt + ${chunk.usage.completion_tokens} answer tokens]`);
}
process.stdout.write('\n');
