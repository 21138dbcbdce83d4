"""Caption an image with a running `qvl serve`, through the official openai Python client.

    pip install openai
    python3 caption.py photo.jpg

Environment: QVL_BASE_URL (default http://127.0.0.1:8000/v1), QVL_API_KEY (if the server has
--api-key), QVL_MODEL (default: the model the server serves).
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


response = client.chat.completions.create(
    model=model,
    messages=[{
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": data_uri(sys.argv[1])}},
            {"type": "text", "text": "Write a one-sentence caption for this image."},
        ],
    }],
    max_tokens=64,
    temperature=0,
)
print(response.choices[0].message.content)
