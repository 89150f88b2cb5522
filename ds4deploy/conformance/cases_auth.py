"""Auth and exposure: which routes refuse a request without the key, how the key is taken from Anthropic clients,
and what answers anyone who reaches the port."""

from __future__ import annotations

import httpx

from ds4deploy.bench.stream import error_text
from ds4deploy.conformance.common import FAIL, FINDING, PASS, Context, Mode, Outcome, anth_post, msg_body

# --- auth and exposure -----------------------------------------------------------------------------------------

# Routes that generate tokens in vLLM's OpenAI-compatible server (vllm/entrypoints/openai/api_server.py and the
# SageMaker-style /invocations of vllm/entrypoints/sagemaker); a 404 means the server does not serve the route.
GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses", "/invocations")
# Routes that answer without generating; reachable from the network only when the bind is not loopback.
INFO_ROUTES = (("GET", "/health"), ("GET", "/metrics"), ("GET", "/version"), ("GET", "/load"), ("GET", "/ping"),
               ("POST", "/tokenize"), ("POST", "/detokenize"))


def _route_body(ctx: Context, route: str) -> dict:
    if route == "/v1/completions":
        return {"model": ctx.model, "prompt": "hi", "max_tokens": 2}
    if route == "/v1/responses":
        return {"model": ctx.model, "input": "hi", "max_output_tokens": 16}
    return {"model": ctx.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def auth_routes(ctx: Context, mode: Mode) -> Outcome:
    """Every generation route refuses a request without a key and with a wrong key (401). A route answering 200
    without the key is a finding on a loopback bind (only this host reaches it) and a fail otherwise."""
    if not ctx.key:
        return Outcome(FINDING, "the server takes no API key: every route answers whoever reaches it "
                                f"({ctx.bind_source})")
    open_, checked = [], []
    for route in GENERATION_ROUTES:
        codes = []
        for hdr in ({}, {"Authorization": "Bearer not-the-key"}):
            r = httpx.post(f"{ctx.url}{route}", json=_route_body(ctx, route), headers=hdr, timeout=ctx.timeout_s)
            codes.append(r.status_code)
        if codes == [404, 404]:
            continue
        checked.append(f"{route} {codes[0]}/{codes[1]}")
        if any(c != 401 for c in codes):
            open_.append(f"{route} answered {codes[0]} without a key, {codes[1]} with a wrong one")
    if not open_:
        return Outcome(PASS, "401 without / with a wrong key: " + ", ".join(checked))
    verdict = FINDING if ctx.bind_loopback else FAIL
    return Outcome(verdict, "; ".join(open_) + f" ({ctx.bind_source})")


def auth_anthropic_header(ctx: Context, mode: Mode) -> Outcome:
    """The key as Anthropic clients send it: ``Authorization: Bearer`` (ANTHROPIC_AUTH_TOKEN) must work;
    ``x-api-key`` (ANTHROPIC_API_KEY) is either accepted or refused with 401 and a message, as the README says."""
    if not ctx.key:
        return Outcome(PASS, "the server takes no API key")
    body = msg_body(ctx, max_tokens=2)
    bearer = anth_post(ctx, body)
    if bearer.status_code != 200:
        return Outcome(FAIL, f"bearer key refused: {error_text(bearer.content, bearer.status_code)}")
    r = httpx.post(f"{ctx.url}/v1/messages", json=body, timeout=ctx.timeout_s,
                   headers={"anthropic-version": "2023-06-01", "x-api-key": ctx.key})
    if r.status_code == 200:
        return Outcome(PASS, "bearer 200, x-api-key 200")
    if r.status_code == 401:
        return Outcome(PASS, f"bearer 200; x-api-key refused as documented ({error_text(r.content, 401)[:120]}): "
                             "Claude Code needs ANTHROPIC_AUTH_TOKEN")
    return Outcome(FAIL, f"x-api-key: {error_text(r.content, r.status_code)}")


def exposure(ctx: Context, mode: Mode) -> Outcome:
    """Routes that answer without a key (/health, /metrics, /tokenize, ...): fine on a loopback bind, a finding
    naming them when the server is reachable from the network."""
    answered = []
    for method, route in INFO_ROUTES:
        body = {"model": ctx.model, "prompt": "hi"} if route == "/tokenize" else {"model": ctx.model, "tokens": [1]}
        r = httpx.request(method, f"{ctx.url}{route}", json=body if method == "POST" else None, timeout=ctx.timeout_s)
        if r.status_code == 200:
            answered.append(route)
    listed = ", ".join(answered) or "none"
    if ctx.bind_loopback:
        return Outcome(PASS, f"without a key: {listed}; loopback only ({ctx.bind_source})")
    return Outcome(FINDING, f"answer anyone who reaches the port without a key: {listed} ({ctx.bind_source})")
