"""Ask a question about an image (visual question answering), through the openai Python client.

    python3 vqa.py photo.jpg "How many people are in the picture?"

Environment: QVL_BASE_URL (default http://127.0.0.1:8000/v1), QVL_API_KEY, QVL_MODEL.
"""
import base64
import mimetypes
import os
import sys

from openai import OpenAI

client = OpenAI(base_url=os.environ.get("QVL_BASE_URL", "http://127.0.0.1:8000/v1"),
                api_key=os.environ.get("QVL_API_KEY", "none"))
model = os.environ.get("QVL_MODEL") or client.models.list().data[0].id


def data_uri(path):
    mime = mimetypes.guess_type(path)[0] or "image/jpeg"
    with open(path, "rb") as f:
        return f"data:{mime};base64,{base64.b64encode(f.read()).decode()}"


image, question = sys.argv[1], sys.argv[2]
response = client.chat.completions.create(
    model=model,
    messages=[
        {"role": "system", "content": "Answer questions about the image briefly and precisely."},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_uri(image)}},
            {"type": "text", "text": question},
        ]},
    ],
    max_tokens=128,
    temperature=0,
)
print(response.choices[0].message.content)
print(f"[{response.usage.prompt_tokens} prompt + {response.usage.completion_tokens} answer tokens, "
      f"finish_reason={response.choices[0].finish_reason}]", file=sys.stderr)
