"""Serving checks against the deployed server, with the real clients: httpx, the OpenAI SDK and the Anthropic
SDK. The served model, port, address and auth policy come from the recipe's render."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

PROMPT = [{"role": "user", "content": "Say hello in one short sentence."}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def _auth(api_key):
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@pytest.fixture
def oai(base_url, api_key):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key or "unused", timeout=120, max_retries=0)


def test_health_is_200(base_url):
    assert httpx.get(f"{base_url}/health", timeout=10).status_code == 200


def test_models_lists_the_served_name(base_url, api_key, dv):
    r = httpx.get(f"{base_url}/v1/models", headers=_auth(api_key), timeout=10)
    assert r.status_code == 200
    assert dv["ds4_served_name"] in [m["id"] for m in r.json()["data"]]


def test_chat_completion_returns_tokens_and_usage(oai, dv):
    r = oai.chat.completions.create(model=dv["ds4_served_name"], messages=PROMPT, max_tokens=16, temperature=0)
    assert r.choices[0].message.content
    assert r.usage.prompt_tokens > 0
    assert r.usage.completion_tokens == 16 or r.choices[0].finish_reason == "stop"


def test_streamed_chat_completion_returns_tokens_and_usage(oai, dv):
    stream = oai.chat.completions.create(
        model=dv["ds4_served_name"], messages=PROMPT, max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert text
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens > 0 and usage.prompt_tokens > 0


def test_anthropic_messages_endpoint_with_the_anthropic_sdk(base_url, api_key, dv):
    client = anthropic.Anthropic(base_url=base_url, api_key=api_key or "unused", timeout=120, max_retries=0)
    msg = client.messages.create(model=dv["ds4_served_name"], max_tokens=16, messages=PROMPT)
    assert msg.role == "assistant"
    assert msg.content and msg.content[0].type == "text" and msg.content[0].text
    assert msg.usage.output_tokens > 0
    with client.messages.stream(model=dv["ds4_served_name"], max_tokens=16, messages=PROMPT) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed
    assert final.usage.output_tokens > 0


def test_required_tool_call_streams_arguments_exactly_once(oai, dv):
    if not dv["ds4_tool_call_parser"]:
        pytest.skip("recipe serves no tool-call parser")
    stream = oai.chat.completions.create(
        model=dv["ds4_served_name"],
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER_TOOL], tool_choice="required", parallel_tool_calls=False,
        max_tokens=128, temperature=0, stream=True,
    )
    names, fragments, ids, finish = [], [], set(), None
    for chunk in stream:
        if not chunk.choices:
            continue
        for tc in chunk.choices[0].delta.tool_calls or []:
            assert tc.index == 0, "one tool call was asked for (parallel_tool_calls=False)"
            if tc.id:
                ids.add(tc.id)
            if tc.function and tc.function.name:
                names.append(tc.function.name)
            if tc.function and tc.function.arguments:
                fragments.append(tc.function.arguments)
        finish = chunk.choices[0].finish_reason or finish
    assert names == ["get_weather"], "the function name must be sent exactly once"
    assert len(ids) == 1
    streamed = "".join(fragments)
    args = json.loads(streamed)  # a fragment sent twice breaks the JSON or duplicates keys below
    assert streamed.count('"city"') == 1
    assert args["city"] in ("Paris", "Oslo", "Lima")
    assert finish == "tool_calls"


def test_request_without_the_key_is_refused(base_url, api_key, dv):
    if dv["ds4_auth_mode"] != "api_key":
        pytest.skip("recipe serves without an API key (loopback only)")
    body = {"model": dv["ds4_served_name"], "messages": PROMPT, "max_tokens": 4}
    assert httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=30).status_code == 401
    wrong = {"Authorization": "Bearer not-the-key"}
    assert httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=wrong, timeout=30).status_code == 401
    ok = httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=_auth(api_key), timeout=60)
    assert ok.status_code == 200


def test_anthropic_route_takes_the_key_as_bearer_only(base_url, api_key, dv):
    """What the README tells Claude Code users: ANTHROPIC_AUTH_TOKEN (bearer), not ANTHROPIC_API_KEY (x-api-key)."""
    if dv["ds4_auth_mode"] != "api_key":
        pytest.skip("recipe serves without an API key (loopback only)")
    body = {"model": dv["ds4_served_name"], "max_tokens": 4, "messages": PROMPT}
    hdr = {"anthropic-version": "2023-06-01"}
    refused = httpx.post(f"{base_url}/v1/messages", json=body, headers={**hdr, "x-api-key": api_key}, timeout=60)
    assert refused.status_code == 401
    ok = httpx.post(f"{base_url}/v1/messages", json=body, headers={**hdr, **_auth(api_key)}, timeout=60)
    assert ok.status_code == 200
    assert ok.json()["type"] == "message"
