"""Benchmark prompts of a given length and content type, counted in the server's own tokens.

A prompt is one user message::

    [bench <run id> #<request no.>]      <- the salt: unique per run and per request, always first
    <context: passages of the content type's bundled set, tiled in a seeded order>
    <the content type's instruction>

The salt comes first so no prompt shares even its first KV block with an earlier one (vLLM chains block hashes, so
a different first block makes every later block a miss). The context is sized with the server's ``/tokenize``
(the same chat template and ``chat_template_kwargs`` as the request) until the templated prompt is within
`FIT_TOLERANCE` tokens of the target; servers without ``/tokenize`` are measured with one-token completions instead.
Each request's ``usage.prompt_tokens`` is then checked again (`prompt_tokens_ok`).

The sets live in ``ds4deploy/data/prompts/<content>.yaml`` (see the README there for their licence).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache
from importlib import resources

import httpx
import yaml

from ds4deploy.core.errors import UserError

CONTENT_TYPES = ("code", "json", "legal", "prose", "chat")


def fit_tolerance(target: int) -> int:
    """Tokens the fitted prompt may differ from the target: 0.2 % or 2 tokens, whichever is larger (the salt's
    token count varies by a token or two between requests)."""
    return max(2, int(target * 0.002))


def prompt_tokens_ok(measured: int, target: int) -> bool:
    """A request's server-reported prompt tokens are close enough to the cell's target: within 2 % or 16 tokens
    (a cell labelled "8K" must really be about 8,192 tokens; the tables round to 1K anyway)."""
    return abs(measured - target) <= max(16, target * 0.02)


@dataclass(frozen=True)
class PromptSet:
    """A content type's bundled passages and the instruction that asks for output of that type."""

    content: str
    instruction: str
    passages: tuple[str, ...]


@cache
def load_prompt_set(content: str) -> PromptSet:
    """The bundled set for `content` (one of `CONTENT_TYPES`).

    Raises:
        UserError: unknown content type.
    """
    if content not in CONTENT_TYPES:
        raise UserError(f"unknown content type '{content}'", f"use one of: {', '.join(CONTENT_TYPES)}")
    data = yaml.safe_load(resources.files("ds4deploy.data").joinpath(f"prompts/{content}.yaml").read_text("utf-8"))
    return PromptSet(content, data["instruction"].strip(), tuple(p.strip() for p in data["passages"]))


def context_text(ps: PromptSet, n_chars: int, seed: int = 0) -> str:
    """`n_chars` characters (cut at a word boundary) of the set's passages, tiled: each round of passages in a
    seeded shuffled order, so a long context is not one block repeated verbatim."""
    rng = random.Random(f"{ps.content}:{seed}")  # noqa: S311 - a text order, not a secret
    parts: list[str] = []
    total = 0
    while total < n_chars:
        order = list(ps.passages)
        rng.shuffle(order)
        for p in order:
            parts.append(p)
            total += len(p) + 2
    text = "\n\n".join(parts)[:max(0, n_chars)]
    cut = text.rfind(" ")
    return text[:cut] if cut > n_chars * 0.9 else text


def salt(run_id: str, index: int) -> str:
    """The per-run, per-request prefix: fixed width so every request's prompt has about the same token count."""
    return f"[bench {run_id} #{index:06d}]"


def message_text(salt_text: str | None, context: str, instruction: str) -> str:
    """The user message: salt (unless disabled), context, instruction."""
    head = f"{salt_text}\n" if salt_text else ""
    return f"{head}{context}\n\n{instruction}"


def _json_or_none(r: httpx.Response):
    """The response's JSON body, or None when it is not JSON."""
    try:
        return r.json()
    except ValueError:
        return None


class TokenCounter:
    """Counts the templated prompt tokens of a chat request on the server under test."""

    def __init__(self, client: httpx.Client, base_url: str, model: str) -> None:
        self.client = client
        self.base_url = base_url
        self.model = model
        self.use_tokenize = True

    def count(self, text: str, template_kwargs: dict | None) -> int:
        """Prompt tokens of one user message `text` as the server counts them for /v1/chat/completions.

        Raises:
            UserError: the server answers neither /tokenize nor a one-token completion.
        """
        messages = [{"role": "user", "content": text}]
        if self.use_tokenize:
            body: dict = {"model": self.model, "messages": messages, "add_generation_prompt": True}
            if template_kwargs:
                body["chat_template_kwargs"] = template_kwargs
            r = self.client.post(f"{self.base_url}/tokenize", json=body, timeout=600)
            answer = _json_or_none(r) if r.status_code == 200 else None
            if isinstance(answer, dict) and "count" in answer:
                return int(answer["count"])
            # llama-server's /tokenize answers 200 without "count": it tokenizes a "content" string only, never chat
            # messages (tools/server/server-context.cpp at the pinned llama.cpp commit); count by completion.
            if r.status_code not in (200, 404, 405):
                raise UserError(f"{self.base_url}/tokenize answered HTTP {r.status_code}: {r.text[:300]}",
                                "check the server log; the prompt may exceed the server's max_model_len")
            self.use_tokenize = False
        body = {"model": self.model, "messages": messages, "max_tokens": 1, "temperature": 0}
        if template_kwargs:
            body["chat_template_kwargs"] = template_kwargs
        r = self.client.post(f"{self.base_url}/v1/chat/completions", json=body, timeout=3600)
        if r.status_code != 200:
            raise UserError(f"cannot count prompt tokens: /tokenize is missing and a one-token completion answered "
                            f"HTTP {r.status_code}: {r.text[:300]}", "check the server log")
        return int(r.json()["usage"]["prompt_tokens"])


def fit_context(counter: TokenCounter, content: str, target: int, template_kwargs: dict | None,
                run_id: str, salted: bool = True) -> tuple[str, int]:
    """A context for `content` such that salt + context + instruction is `target` templated tokens (within
    `fit_tolerance`); without the salt when `salted` is False. Returns (context, measured tokens with a
    representative salt).

    Raises:
        UserError: `target` is shorter than the salt, the instruction and the chat template alone.
    """
    ps = load_prompt_set(content)
    s = salt(run_id, 0) if salted else None
    bare = counter.count(message_text(s, "", ps.instruction), template_kwargs)
    if bare >= target - 8:
        raise UserError(f"a {target}-token {content} prompt is too short: the salt, instruction and chat template "
                        f"alone take {bare} tokens", "use prompt lengths of 256 tokens or more")
    sample = context_text(ps, 8000)
    per_char = (counter.count(message_text(s, sample, ps.instruction), template_kwargs) - bare) / len(sample)
    n_chars = int((target - bare) / per_char)
    best: tuple[int, str, int] | None = None
    for _ in range(12):
        ctx = context_text(ps, n_chars)
        n = counter.count(message_text(s, ctx, ps.instruction), template_kwargs)
        if best is None or abs(n - target) < best[0]:
            best = (abs(n - target), ctx, n)
        if abs(n - target) <= fit_tolerance(target):
            break
        step = int((target - n) / per_char)
        n_chars += step if step else (1 if n < target else -1)
    assert best is not None
    return best[1], best[2]
