// Ask a question about an image (visual question answering), through the openai npm client.
//   node vqa.mjs photo.jpg "How many people are in the picture?"
// Environment: QVL_BASE_URL (default http://127.0.0.1:8000/v1), QVL_API_KEY, QVL_MODEL.
import { client, servedModel, dataUri } from './common.mjs';

const [image, question] = process.argv.slice(2);
const response = await client.chat.completions.create({
  model: await servedModel(),
  messages: [
    { role: 'system', content: 'Answer questions about the image briefly and precisely.' },
    { role: 'user', content: [
      { type: 'image_url', image_url: { url: dataUri(image) } },
      { type: 'text', text: question },
    ] },
  ],
  max_tokens: 128,
  temperature: 0,
});
console.log(response.choices[0].message.content);
const { usage } = response;
console.error(`[${usage.prompt_tokens} prompt + ${usage.completion_tokens} answer tokens, ` +
  `finish_reason=${response.choices[0].finish_reason}]`);
