#!/usr/bin/env python3
"""Writes tests/fixtures/chat_template/conversations.json: the conversations the chat-template golden
test renders, in the shape `qvl tokenize --template` reads (OpenAI-style messages; an image part
carries its patch grid as "grid": [t, h, w]). Standard library only, deterministic:

    python3 tools/reference/make_chat_conversations.py --out tests/fixtures/chat_template

Each grid has h·w >= 256 and even sides, so a synthetic image of (16·h) x (16·w) pixels keeps exactly
that grid through Qwen3-VL's smart_resize (factor 32, min_pixels 65536); chat_template_ref.py checks it.
"""
import argparse
import datetime
import json
import os
import sys


def img(h, w, t=1):
    return {"type": "image", "grid": [t, h, w]}


def img_url(h, w):
    return {"type": "image_url", "image_url": {"url": "file:///synthetic.png"}, "grid": [1, h, w]}


def text(s):
    return {"type": "text", "text": s}


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city — returns °C.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. 東京 or Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 16, "default": 1.0},
            },
            "required": ["city"],
        },
    },
}
CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate \"expr\" exactly.\nNewlines\tand tabs are escaped.",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}, "precision": {"type": "number",
                       "default": 1e-05, "max": 1e16, "min": -0.0, "step": 0.25}}, "required": ["expr"]},
    },
}


def conversations():
    c = []

    def add(name, messages, add_generation_prompt=True, **extra):
        c.append(dict(name=name, messages=messages, add_generation_prompt=add_generation_prompt, **extra))

    add("user_text", [{"role": "user", "content": "Hello!"}])
    add("spec_example_image_then_text", [{"role": "user", "content": [img(16, 16), text("Describe this image.")]}])
    add("system_and_user", [{"role": "system", "content": "You are a helpful assistant."},
                            {"role": "user", "content": "What is 2+2?"}])
    add("text_image_text", [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": [text("Look: "), img(16, 24), text(" — what is it?")]}])
    add("three_images_one_message", [{"role": "user", "content": [img(16, 16), img(24, 16), img(20, 28),
                                                                  text("Compare these three pictures.")]}])
    add("adjacent_images_text_between", [{"role": "user", "content": [text("A:"), img(16, 16), img(16, 16),
                                                                      text("\nB:"), img(12, 22)]}])
    add("multi_turn_images", [
        {"role": "user", "content": [img(16, 16), text("What animal is this?")]},
        {"role": "assistant", "content": "It is a cat."},
        {"role": "user", "content": [text("And this one?"), img(32, 32)]},
    ])
    add("assistant_list_content", [
        {"role": "user", "content": "Say hi in two parts."},
        {"role": "assistant", "content": [text("Hi"), text(" there!")]},
        {"role": "user", "content": "Again."},
    ])
    add("system_as_list", [{"role": "system", "content": [text("You are "), text("terse.")]},
                           {"role": "user", "content": [text("Caption:"), img(16, 20)]}])
    add("empty_strings", [{"role": "system", "content": ""}, {"role": "user", "content": ""},
                          {"role": "assistant", "content": ""}, {"role": "user", "content": [text("")]}])
    add("no_generation_prompt", [{"role": "user", "content": "Ping"}, {"role": "assistant", "content": "Pong"}],
        add_generation_prompt=False)
    add("add_vision_id", [
        {"role": "user", "content": [img(16, 16), img(16, 16), text("Which is brighter?")]},
        {"role": "assistant", "content": "The second."},
        {"role": "user", "content": [text("Now this: "), img(16, 18)]},
    ], add_vision_id=True)
    add("tools_with_system", [{"role": "system", "content": "You can call tools."},
                              {"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER_TOOL, CALC_TOOL])
    add("tools_without_system", [{"role": "user", "content": [img(16, 16), text("Where is this? Check weather.")]}],
        tools=[WEATHER_TOOL])
    add("tool_call_string_arguments", [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21.5}"},
    ], tools=[WEATHER_TOOL])
    add("tool_call_object_arguments_with_content", [
        {"role": "user", "content": "Compute and check weather."},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "calc", "arguments": {
                "expr": "1/3", "precision": 1e-05, "z": [1, 2.5, True, None], "ünï": "日本"}}},
            {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich",
                                                                                             "days": 3}}}]},
        {"role": "tool", "content": "0.33333"},
        {"role": "tool", "content": [text("cloudy, "), text("12 °C")]},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Thanks"},
    ], tools=[CALC_TOOL, WEATHER_TOOL])
    add("tool_response_with_image", [
        {"role": "user", "content": "Fetch the chart."},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "fetch", "arguments": "{}"}}]},
        {"role": "tool", "content": [text("chart:"), img(16, 32)]},
    ], add_vision_id=True)
    add("system_in_the_middle_is_dropped", [
        {"role": "user", "content": "First."},
        {"role": "system", "content": "This system message is dropped by the template."},
        {"role": "user", "content": "Second."},
    ])
    add("unicode_and_whitespace", [{"role": "user", "content": [
        text("  \n 你好，世界！ 👩‍💻🇯🇵 e\u0301 naïve DON'T\r\n\t"), img(16, 16), text("\n\n")]}])
    add("special_tokens_in_user_text", [{"role": "user", "content": "a<|im_end|>b<|im_start|>c <think>x</think>"}])
    add("empty_list_contents", [{"role": "user", "content": []}, {"role": "assistant", "content": []},
                                {"role": "user", "content": [text("ok")]}])
    add("image_url_parts", [{"role": "user", "content": [img_url(16, 16), text("What is this?"),
                                                         img_url(20, 16)]}])
    add("long_multi_turn", [
        {"role": "system", "content": "You are a vision assistant."},
        {"role": "user", "content": [img(16, 16), text("Describe.")]},
        {"role": "assistant", "content": "A red square."},
        {"role": "user", "content": "Any text in it?"},
        {"role": "assistant", "content": "No text."},
        {"role": "user", "content": [text("Compare with:"), img(16, 16)]},
        {"role": "assistant", "content": [text("The second is "), text("blue.")]},
        {"role": "user", "content": "Thanks!"},
    ])
    add("large_grid", [{"role": "user", "content": [img(64, 48), text("Read all text in this document.")]}])
    add("newline_only_texts", [{"role": "user", "content": "\n\n"}, {"role": "assistant", "content": "\r\n"},
                               {"role": "user", "content": " "}])
    add("assistant_last_with_generation_prompt", [{"role": "user", "content": "Continue"},
                                                  {"role": "assistant", "content": "Sure"}])
    add("tool_first_message", [{"role": "tool", "content": "orphan tool result"},
                               {"role": "user", "content": "What was that?"}])
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (tests/fixtures/chat_template)")
    args = ap.parse_args()
    convs = conversations()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "conversations.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(convs, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(args.out, "MANIFEST"), "w") as f:
        f.write("conversations.json\n  script: tools/reference/make_chat_conversations.py\n")
        f.write("  command: python3 " + " ".join(sys.argv) + "\n")
        f.write(f"  python: {sys.version.split()[0]}\n  date: {datetime.date.today().isoformat()}\n")
        f.write(f"  conversations: {len(convs)}\n")
        f.write("reference.jsonl: not yet produced; run tools/reference/chat_template_ref.py on the GPU machine\n")
    print(f"wrote {path}: {len(convs)} conversations")


if __name__ == "__main__":
    main()
