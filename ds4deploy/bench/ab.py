"""`ds4deploy bench ab <A> <B>`: paired A/B of two server configurations with greedy decoding.

The V100 system (docs/sources.md#v100x8-method) accepted a tuning switch only after a paired A/B on the rig that gave
byte-identical greedy output (or a near tie). This command runs that A/B:

- A and B are two running servers: a base URL (``http://127.0.0.1:8110``, key from ``--key-file`` /
  ``--key-file-a`` / ``--key-file-b``) or a recipe name (its serving address, deployed key file and served model).
- Prompts: `pairs` salted prompts (``[bench <run id> #<n>]`` first, unique per run and pair, so neither server's
  prefix cache serves them), cycling over the bundled content types and fitted to ``--prompt-tokens`` with A's
  tokenizer. Pair *i* sends the same prompt to A and to B.
- Greedy only: temperature 0, top_p 1, a fixed ``seed``, the same ``max_tokens``; a temperature above 0 is
  refused (sampled outputs differ by design, so identity would mean nothing).
- Interleaved: pairs alternate the order, A then B, then B then A, ..., one request at a time, so host drift and
  warm-up effects hit both sides alike. One unrecorded warm-up request per side first.
- Speed: per pair the ratios B/A of output tok/s (completion tokens / request latency, as in
  tools/benchval/stack.py: on a fast model the server packs several tokens per chunk, so a first-to-last-chunk
  rate swings; tokens over the whole request do not) and of TTFT. Reported: the median ratio, the min..max over
  pairs, and a bootstrap 95 % interval of the median (percentile bootstrap, `BOOTSTRAP_RESAMPLES` resamples of the
  pairs, seed 0).
- Identity: per pair, the streamed reasoning + content bytes of A and B (sha256 and the text); the first
  differing byte is reported. The verdict is "identical" only if every pair is byte-identical.

- Across engine families (``--cross-family``, or A and B of different engine families: a recipe's
  ``engine.family``, else the ``owned_by`` of the server's ``/v1/models``; vLLM against llama.cpp): byte identity
  is not expected (other kernels, other numerics, another tokenizer implementation), so it is no verdict; the
  report gives agreement apart from speed: pairs identical, and the share of the longer
  output's bytes before the first difference (median, min..max over pairs). The exit code then says only whether
  every request succeeded.

Exit codes: 0 every pair identical (across families: every request answered) and no request failed; 1 an output
differed or a request failed (the A/B ran; the switch is not accepted by the rule above); 2 could not run (bad
input, unreachable server, refused key, lock held).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import httpx
import numpy as np

from ds4deploy.bench.lock import ServerLock
from ds4deploy.bench.prompts import CONTENT_TYPES, TokenCounter, fit_context, load_prompt_set, message_text, salt
from ds4deploy.bench.report import atomic_write_text
from ds4deploy.bench.run import check_server, read_key
from ds4deploy.bench.stream import RequestResult, StreamParser, error_text, feed_stream
from ds4deploy.core.errors import UserError
from ds4deploy.engines import family_of_models

BOOTSTRAP_RESAMPLES = 2000


@dataclass
class Side:
    """One configuration under test: its label ("A"/"B"), base URL, API key (None: no auth) and served model."""

    label: str
    spec: str
    url: str
    key: str | None
    model: str | None
    family: str | None = None  # engine family: the recipe's engine.family, else what the server's /v1/models says


def resolve_side(label: str, spec: str, key_file: str | None) -> Side:
    """A side from a URL (``http(s)://host:port``; key from `key_file`, else none) or a recipe name (its serving
    address, its deployed key file unless `key_file` is given, its served model name).

    Raises:
        UserError: unknown recipe, unreadable key file.
    """
    if spec.startswith(("http://", "https://")):
        return Side(label, spec, spec.rstrip("/"), read_key(None, key_file) if key_file else None, None)
    from ds4deploy.core.net import base_url
    from ds4deploy.recipe.load import load_recipe

    recipe = load_recipe(spec)
    return Side(label, spec, base_url(recipe.serving.bind_address, recipe.serving.port).rstrip("/"),
                read_key(recipe, key_file), recipe.model.served_name, recipe.engine.family)


def served_family(client: httpx.Client, side: Side) -> str | None:
    """`side`'s engine family: the recipe's, else from the server's ``/v1/models`` (``owned_by``,
    `ds4deploy.engines.family_of_models`), else None."""
    if side.family:
        return side.family
    try:
        return family_of_models(client.get(f"{side.url}/v1/models", timeout=30).json())
    except (httpx.HTTPError, ValueError):
        return None


def served_model(client: httpx.Client, side: Side, wanted: str | None) -> str:
    """The model name to send to `side`: `wanted`, else the recipe's, else the server's only model.

    Raises:
        UserError: the server is unreachable / refuses the key / does not serve the model; several models and
            none named.
    """
    if wanted or side.model:
        check_server(client, side.url, wanted or side.model)
        return wanted or side.model
    try:
        r = client.get(f"{side.url}/v1/models", timeout=30)
    except httpx.HTTPError as exc:
        raise UserError(f"cannot reach {side.label} at {side.url}: {type(exc).__name__}: {exc}",
                        "check the URL and that the server is up") from None
    if r.status_code in (401, 403):
        raise UserError(f"{side.label} ({side.url}) refused the API key (HTTP {r.status_code})",
                        f"pass --key-file-{side.label.lower()} with that server's key file (VLLM_API_KEY=<key>)")
    if r.status_code != 200:
        raise UserError(f"{side.url}/v1/models answered {error_text(r.content, r.status_code)}",
                        "point the A/B at OpenAI-compatible servers (vLLM)")
    names = [m.get("id") for m in r.json().get("data", [])]
    if len(names) != 1:
        raise UserError(f"{side.label} ({side.url}) serves {len(names)} models ({', '.join(map(str, names))})",
                        "name one with --model")
    return names[0]


class TextParser(StreamParser):
    """`StreamParser` that also keeps the streamed text (reasoning + content, in order) for the identity report."""

    def __init__(self, result: RequestResult, max_tokens: int | None) -> None:
        super().__init__(result, max_tokens)
        self.parts: list[str] = []

    def feed(self, line: str, now: float) -> None:
        """As `StreamParser.feed`, and collect the text of each token chunk."""
        super().feed(line, now)
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            return
        try:
            data = json.loads(line[5:])
        except json.JSONDecodeError:
            return
        for choice in data.get("choices") or ():
            delta = choice.get("delta") or {}
            self.parts.append((delta.get("reasoning") or delta.get("reasoning_content") or "")
                              + (delta.get("content") or ""))


async def one_request(session: aiohttp.ClientSession, side: Side, payload: dict, index: int) -> dict:
    """Stream one request to `side`; returns its RequestResult fields plus ``text`` and ``output_tok_s``
    (completion tokens / request latency). Server and network failures come back with ``ok`` False."""
    result = RequestResult(index=index)
    parser = TextParser(result, payload.get("max_tokens"))
    r = parser.finish(await feed_stream(session, f"{side.url}/v1/chat/completions", payload, result, parser))
    d = r.as_dict()
    d["text"] = "".join(parser.parts)
    d["output_tok_s"] = (r.completion_tokens / r.e2e_s) if r.ok and r.completion_tokens and r.e2e_s else None
    return d


def first_difference(a: str, b: str) -> int | None:
    """Byte offset (UTF-8) of the first difference between `a` and `b`; None when they are identical."""
    ab, bb = a.encode(), b.encode()
    if ab == bb:
        return None
    n = min(len(ab), len(bb))
    return next((i for i in range(n) if ab[i] != bb[i]), n)


def ratio_stats(ratios: list[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> dict:
    """Median of paired ratios with its spread.

    Returns:
        ``{"n", "median", "min", "max", "ci95": [low, high] | None, "ci_method"}``: the bootstrap interval is the
        2.5th and 97.5th percentile of the medians of `resamples` resamples (with replacement) of the pairs
        (numpy default_rng(seed)); None with fewer than 3 pairs. All None when `ratios` is empty.
    """
    if not ratios:
        return {"n": 0, "median": None, "min": None, "max": None, "ci95": None, "ci_method": None}
    a = np.asarray(ratios, dtype=float)
    out = {"n": len(a), "median": float(np.median(a)), "min": float(a.min()), "max": float(a.max()), "ci95": None,
           "ci_method": f"percentile bootstrap of the median, {resamples} resamples of the pairs, seed {seed}"}
    if len(a) >= 3:
        rng = np.random.default_rng(seed)
        meds = np.median(rng.choice(a, size=(resamples, len(a)), replace=True), axis=1)
        out["ci95"] = [float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))]
    return out


def analyse(pairs: list[dict]) -> dict:
    """Speed ratios (B/A) and identity over the pairs (each ``{"index", "a", "b"}`` with `one_request` dicts).

    Returns:
        ``{"pairs", "failed", "identical", "different", "tok_s_ratio", "ttft_ratio", "shared_prefix",
        "differences", "a", "b"}``; ``a``/``b``: each side on its own over the pairs where both succeeded, the
        median output tok/s, TTFT (s) and prompt tokens as that server counted them (its own tokenizer);
        ``shared_prefix``: per pair the bytes before the first difference / the longer output's
        bytes (1.0 when identical), its median, min and max;
        ``tok_s_ratio``/``ttft_ratio`` from `ratio_stats` over pairs where both requests succeeded;
        ``differences`` lists each differing pair with the first differing byte and the text around it.
    """
    ok = [p for p in pairs if p["a"]["ok"] and p["b"]["ok"]]
    tok = [p["b"]["output_tok_s"] / p["a"]["output_tok_s"] for p in ok
           if p["a"]["output_tok_s"] and p["b"]["output_tok_s"]]
    ttft = [p["b"]["ttft_s"] / p["a"]["ttft_s"] for p in ok if p["a"]["ttft_s"] and p["b"]["ttft_s"]]
    diffs, shared = [], []
    for p in ok:
        at, bt = p["a"]["text"], p["b"]["text"]
        at_b, bt_b = at.encode(), bt.encode()
        off = first_difference(at, bt)
        p["identical"] = off is None
        longer = max(len(at_b), len(bt_b))
        shared.append(1.0 if off is None or longer == 0 else off / longer)
        if off is not None:
            lo = max(0, off - 20)
            diffs.append({"pair": p["index"], "byte": off, "a_tokens": p["a"]["completion_tokens"],
                          "b_tokens": p["b"]["completion_tokens"],
                          "a": at_b[lo:off + 40].decode(errors="replace"),
                          "b": bt_b[lo:off + 40].decode(errors="replace")})
    share = ratio_stats(shared)

    def side(k: str) -> dict:
        tps = [p[k]["output_tok_s"] for p in ok if p[k]["output_tok_s"]]
        ttfts = [p[k]["ttft_s"] for p in ok if p[k]["ttft_s"]]
        prompts = [p[k]["prompt_tokens"] for p in ok if p[k].get("prompt_tokens")]
        return {"output_tok_s_median": float(np.median(tps)) if tps else None,
                "ttft_s_median": float(np.median(ttfts)) if ttfts else None,
                "prompt_tokens_median": float(np.median(prompts)) if prompts else None}

    return {"pairs": len(pairs), "failed": len(pairs) - len(ok), "identical": len(ok) - len(diffs),
            "different": len(diffs), "tok_s_ratio": ratio_stats(tok), "ttft_ratio": ratio_stats(ttft),
            "shared_prefix": {k: share[k] for k in ("n", "median", "min", "max")}, "differences": diffs,
            "a": side("a"), "b": side("b")}


def _fmt_ratio(s: dict) -> str:
    if s["median"] is None:
        return "-"
    ci = f"; 95 % CI {s['ci95'][0]:.3f}-{s['ci95'][1]:.3f}" if s["ci95"] else ""
    return f"{s['median']:.3f} (pairs {s['min']:.3f}..{s['max']:.3f}{ci})"


def _num(v: float | None, fmt: str, unit: str = "") -> str:
    return "-" if v is None else f"{v:{fmt}}{unit}"


def exit_status(stats: dict, cross: bool) -> int:
    """`run_ab`'s exit code for `analyse`'s stats: 1 when a request failed, or (same family) a pair differs; else
    0. Across families the outputs' agreement is reported, never judged."""
    if stats["failed"]:
        return 1
    return 0 if cross or stats["different"] == 0 else 1


def _side(s: dict) -> str:
    where = s["url"] if s["spec"] == s["url"] else f"{s['spec']}, {s['url']}"
    fam = f", engine family {s['family']}" if s.get("family") else ""
    return f"{where}, model `{s['model']}`{fam}" + (f" ({s['label']})" if s.get("label") else "")


def _cell(text: str) -> str:
    """A text snippet for a markdown table cell: repr (control bytes visible), pipes and backticks escaped."""
    return "<code>" + repr(text).replace("|", "\\|").replace("`", "'").replace("<", "&lt;") + "</code>"


def markdown(res: dict) -> str:
    """The A/B report."""
    a, b, st = res["a"], res["b"], res["stats"]
    verdict = ("identical: every pair's greedy output is byte-identical" if st["different"] == 0 and not st["failed"]
               else f"NOT identical: {st['different']} of {st['pairs']} pairs differ, {st['failed']} failed")
    if res.get("cross_family"):
        sp = st["shared_prefix"]
        share = "-" if sp["median"] is None else (f"{100 * sp['median']:.0f} % (pairs {100 * sp['min']:.0f}.."
                                                  f"{100 * sp['max']:.0f} %)")
        verdict = (f"agreement across engine families (no verdict: byte identity is not expected): "
                   f"{st['identical']} of {st['pairs']} pairs identical, {st['failed']} failed; shared prefix, median "
                   f"share of the longer output: {share}")
    lines = [
        f"# A/B `{res['name']}`",
        "",
        f"Run {res['run_id']}, {res['date']}. A = {_side(a)}; B = {_side(b)}. {st['pairs']} pairs, "
        "interleaved (A,B), (B,A), ...; greedy "
        f"(temperature 0, top_p 1, seed {res['seed']}), max_tokens {res['max_tokens']}"
        f"{', ignore_eos' if res['ignore_eos'] else ''}; salted {res['prompt_tokens']}-token prompts over "
        f"{', '.join(res['contents'])}.",
        "",
        f"**Greedy output: {verdict}.**",
        "",
        "| B / A | median of paired ratios (min..max; bootstrap 95 % CI of the median) |",
        "|---|---|",
        f"| output tok/s (completion tokens / request latency) | {_fmt_ratio(st['tok_s_ratio'])} |",
        f"| TTFT | {_fmt_ratio(st['ttft_ratio'])} |",
        "",
        f"CI method: {st['tok_s_ratio']['ci_method'] or '-'}. A ratio above 1 means B is faster (tok/s) or slower "
        "(TTFT).",
        "",
    ]
    if res.get("cross_family") and "a" in st:
        lines += ["| each side, median over the pairs | output tok/s | TTFT | prompt tokens (its own count) |",
                  "|---|---|---|---|"]
        for k in ("a", "b"):
            x = st[k]
            lines.append(f"| {k.upper()} ({res[k].get('family') or '?'}) | {_num(x['output_tok_s_median'], '.1f')} | "
                         f"{_num(x['ttft_s_median'] and x['ttft_s_median'] * 1000, '.0f', ' ms')} | "
                         f"{_num(x['prompt_tokens_median'], '.0f')} |")
        lines.append("")
    if st["differences"]:
        lines += ["| pair | first differing byte | A tokens | B tokens | A text there | B text there |",
                  "|---|---|---|---|---|---|"]
        for d in st["differences"]:
            lines.append(f"| {d['pair']} | {d['byte']} | {d['a_tokens']} | {d['b_tokens']} | {_cell(d['a'])} | "
                         f"{_cell(d['b'])} |")
        lines.append("")
    lines.append(f"Raw pairs: `{res['name']}.json`.")
    return "\n".join(lines) + "\n"


async def _run_pairs(sides: tuple[Side, Side], payloads: list[dict], warmups: tuple[dict, dict], timeout_s: float,
                     say) -> list[dict]:
    to = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=timeout_s)
    sa, sb = sides
    async with (aiohttp.ClientSession(headers=_auth(sa), timeout=to) as ca,
                aiohttp.ClientSession(headers=_auth(sb), timeout=to) as cb):
        for side, sess, w in ((sa, ca, warmups[0]), (sb, cb, warmups[1])):
            r = await one_request(sess, side, w, -1)
            if not r["ok"]:
                raise UserError(f"the warm-up request to {side.label} ({side.url}) failed: {r['error']}",
                                "check that server (its log); the A/B sends greedy requests with max_tokens and seed")
        pairs = []
        for i, body in enumerate(payloads):
            order = ((sa, ca, "a"), (sb, cb, "b")) if i % 2 == 0 else ((sb, cb, "b"), (sa, ca, "a"))
            pair: dict = {"index": i, "order": "AB" if i % 2 == 0 else "BA"}
            for side, sess, k in order:
                pair[k] = await one_request(sess, side, {**body, "model": side.model}, i)
            pairs.append(pair)
            say(f"pair {i} ({pair['order']}): A {_fmt_req(pair['a'])} | B {_fmt_req(pair['b'])} | "
                f"{'identical' if pair['a']['text'] == pair['b']['text'] else 'DIFFERENT'}")
        return pairs


def _auth(side: Side) -> dict:
    return {"Authorization": f"Bearer {side.key}"} if side.key else {}


def _fmt_req(r: dict) -> str:
    if not r["ok"]:
        return f"failed: {r['error']}"
    return f"{r['completion_tokens']} tok, TTFT {r['ttft_s'] * 1000:.0f} ms, {r['output_tok_s']:.1f} tok/s"


def run_ab(ns: argparse.Namespace) -> int:
    """Entry point of `ds4deploy bench ab`. Returns 0 (identical, no failure; across families: no failure), 1 (differs
    or failed)."""
    if ns.temperature != 0:
        raise UserError(f"bench ab compares greedy output; temperature {ns.temperature} samples, so two identical "
                        "servers would differ by design", "drop --temperature (ab always sends temperature 0)")
    if ns.pairs < 1 or ns.max_tokens < 1:
        raise UserError("--pairs and --max-tokens must be at least 1", "e.g. --pairs 16 --max-tokens 128")
    a = resolve_side("A", ns.a, ns.key_file_a or ns.key_file)
    b = resolve_side("B", ns.b, ns.key_file_b or ns.key_file)
    if a.url == b.url:
        raise UserError(f"A and B are the same server ({a.url})", "start the second configuration on another port")
    say = (lambda _m: None) if ns.quiet else (lambda m: print(m, flush=True))
    run_id = secrets.token_hex(4)
    contents = list(ns.content or CONTENT_TYPES)
    first, second = sorted((a, b), key=lambda s: s.url)  # fixed lock order: two A/Bs never deadlock
    with ServerLock(first.url), ServerLock(second.url):
        for s in (a, b):
            with httpx.Client(headers=_auth(s), timeout=httpx.Timeout(ns.timeout, connect=30)) as client:
                s.model = served_model(client, s, ns.model)
                s.family = served_family(client, s)
        # Across families when asked, or when both sides say which family serves them and they differ.
        cross = bool(getattr(ns, "cross_family", False)) or (None not in (a.family, b.family)
                                                             and a.family != b.family)
        with httpx.Client(headers=_auth(a), timeout=httpx.Timeout(ns.timeout, connect=30)) as client:
            counter = TokenCounter(client, a.url, a.model)
            ctx = {c: fit_context(counter, c, ns.prompt_tokens, None, run_id)[0] for c in contents}

        def body(n: int, content: str) -> dict:
            ps = load_prompt_set(content)
            d = {"messages": [{"role": "user", "content": message_text(salt(run_id, n), ctx[content],
                                                                        ps.instruction)}],
                 "max_tokens": ns.max_tokens, "temperature": 0.0, "top_p": 1.0, "seed": ns.seed, "stream": True,
                 "stream_options": {"include_usage": True}}
            if ns.ignore_eos:
                d["ignore_eos"] = True
            return d

        payloads = [body(i, contents[i % len(contents)]) for i in range(ns.pairs)]
        warm = (body(900000, contents[0]) | {"model": a.model}, body(900001, contents[0]) | {"model": b.model})
        pairs = asyncio.run(_run_pairs((a, b), payloads, warm, ns.timeout, say))
    stats = analyse(pairs)
    res = {
        "schema": "ds4deploy-bench-ab/1", "name": ns.name, "run_id": run_id,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "a": {"spec": a.spec, "url": a.url, "model": a.model, "label": ns.label_a, "family": a.family},
        "b": {"spec": b.spec, "url": b.url, "model": b.model, "label": ns.label_b, "family": b.family},
        "seed": ns.seed, "max_tokens": ns.max_tokens, "ignore_eos": ns.ignore_eos, "prompt_tokens": ns.prompt_tokens,
        "contents": contents, "stats": stats, "pairs": pairs, "cross_family": cross,
    }
    out = Path(ns.out)
    atomic_write_text(out / f"{ns.name}.json", json.dumps(res, indent=1) + "\n")
    md = markdown(res)
    atomic_write_text(out / f"{ns.name}.md", md)
    print(md if not ns.quiet else "", end="")
    print(f"wrote {out / (ns.name + '.md')}", file=sys.stderr)
    return exit_status(stats, cross)
