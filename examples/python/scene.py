"""Analyse a scene and stream the answer as it is generated, through the openai Python client.

    python3 scene.py street.jpg

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


prompt = ("Analyse this scene. List: 1) the setting and time of day, 2) the main objects and people "
          "with where they are, 3) what is happening, 4) anything unusual or hazardous.")
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_uri(sys.argv[1])}},
        {"type": "text", "text": prompt},
    ]}],
    max_tokens=512,
    stream=True,
    stream_options={"include_usage": True},
)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print(chunk.choices[0].delta.content, end="", flush=True)
    if chunk.usage:
        print(f"\n[{chunk.usage.prompt_tokens} prompt + {chunk.usage.completion_tokens} answer tokens]",
              file=sys.stderr)
print()
