// Caption an image with a running `qvl serve`, through the official openai npm client.
//   npm install openai && node caption.mjs photo.jpg
// Environment: QVL_BASE_URL (default http://127.0.0.1:8000/v1), QVL_API_KEY, QVL_MODEL.
import { client, servedModel, dataUri } from './common.mjs';

const response = await client.chat.completions.create({
  model: await servedModel(),
  messages: [{
    role: 'user',
    content: [
      { type: 'image_url', image_url: { url: dataUri(process.argv[2]) } },
      { type: 'text', text: 'Write a one-sentence caption for this image.' },
    ],
  }],
  max_tokens: 64,
  temperature: 0,
});
console.log(response.choices[0].message.content);
