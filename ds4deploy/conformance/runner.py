"""`ds4deploy conformance <recipe>` (or ``--url``/``--key-file`` for any OpenAI/Anthropic-compatible server): run
every case in every mode that applies, print the table, write the reports.

Order: resolve the server (the recipe's address, port, key file and model, or the flags), check it can be tested
at all (reachable, key accepted, OpenAI-compatible, the model served: else one message, exit 2), run the matrix,
judge it by the engine family's rules (`ds4deploy.conformance.engine_rules`: the recipe's family, else the one the
server's /v1/models names), print the table, write docs/results/conformance/<recipe>/conformance.{json,md}. Exit 0
when nothing failed, 1 when a case failed.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import os
import platform
import re
import time
from datetime import UTC, datetime
from importlib.metadata import version as pkg_version
from pathlib import Path
from urllib.parse import urlsplit

import anthropic
import httpx
import openai

from ds4deploy.bench.docs_section import RESULTS_DIR
from ds4deploy.bench.run import read_key
from ds4deploy.bench.stream import error_text
from ds4deploy.conformance import cases, engine_rules, report
from ds4deploy.conformance.common import NO_MESSAGE_START_SDK
from ds4deploy.conformance.record import load_shapes
from ds4deploy.core.errors import UserError
from ds4deploy.core.net import base_url, is_loopback_host
from ds4deploy.engines import family_of_models
from ds4deploy.recipe.load import load_recipe
from ds4deploy.recipe.schema import Benchmark, Recipe


def probe_server(url: str, key: str | None, model: str | None,
                 timeout_s: float = 30.0) -> tuple[str, int | None, str | None]:
    """Check the server can be tested: reachable, the key accepted, an OpenAI-compatible ``/v1/models``, the model
    served. Returns (model, its max_model_len in tokens or None when the server does not report it, the engine
    family its ``/v1/models`` names or None: `ds4deploy.engines.family_of_models`); the model is the server's only
    one when `model` is None.

    Raises:
        UserError: one message per cause (exit 2).
    """
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        r = httpx.get(f"{url}/v1/models", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise UserError(f"cannot reach a server at {url}: {type(exc).__name__}: {exc}",
                        "check --url (default: the recipe's serving address and port) and that the server is up "
                        "(`make status`)") from None
    if r.status_code in (401, 403):
        raise UserError(f"{url} refused the API key (HTTP {r.status_code})" if key else
                        f"{url} wants an API key (HTTP {r.status_code}) and none was given",
                        "pass --key-file with the server's key file (VLLM_API_KEY=<key>)")
    try:
        body = r.json() if r.status_code == 200 else None
        served = {m["id"]: m.get("max_model_len") for m in body["data"]}
    except (ValueError, KeyError, TypeError):
        served = None
    if served is None:
        raise UserError(f"{url} is not an OpenAI-compatible server: GET /v1/models answered "
                        f"{error_text(r.content, r.status_code)[:200]}",
                        "point --url at the server's base URL (http://host:port, without /v1) of vLLM or another "
                        "OpenAI-compatible server")
    if model is None:
        if len(served) != 1:
            raise UserError(f"{url} serves {len(served)} models ({', '.join(served) or 'none'})",
                            "pass --model with the one to test")
        model = next(iter(served))
    if model not in served:
        raise UserError(f"{url} does not serve model '{model}' (it serves: {', '.join(served) or 'none'})",
                        "pass --model with one of those, or point --url at the recipe's server")
    return model, served[model], family_of_models(body)


def server_version(url: str, key: str | None) -> str:
    """``vllm <version>`` from vLLM's ``/version``, else ``unknown``."""
    try:
        r = httpx.get(f"{url}/version", headers={"Authorization": f"Bearer {key}"} if key else {}, timeout=10)
        return f"vllm {r.json()['version']}" if r.status_code == 200 else "unknown"
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return "unknown"


def bind_of(recipe: Recipe | None, url: str) -> tuple[bool | None, str]:
    """(whether the server listens on loopback only, where that comes from): the recipe's bind_address, else the
    URL's host (non-loopback: reachable from the network; loopback: not known, it may listen on more)."""
    if recipe is not None:
        addr = recipe.serving.bind_address
        return ipaddress.ip_address(addr).is_loopback, f"recipe {recipe.name} binds {addr}"
    host = urlsplit(url).hostname or ""
    if is_loopback_host(host):
        return None, f"bind not known: reached on {host}, the server may also listen on other addresses"
    return False, f"reached over the network at {host}"


def _clients() -> dict[str, str]:
    return {name: pkg_version(name) for name in ("openai", "anthropic", "httpx")}


def select(only: str | None) -> list[cases.Case]:
    """The cases whose name contains one of the comma-separated `only` words (all when None).

    Raises:
        UserError: no case matches.
    """
    if not only:
        return list(cases.CASES)
    words = [w.strip() for w in only.split(",") if w.strip()]
    chosen = [c for c in cases.CASES if any(w in c.name for w in words)]
    if not chosen:
        raise UserError(f"--only {only} matches no case", "pick from: " + ", ".join(c.name for c in cases.CASES))
    return chosen


def run_case(ctx: cases.Context, case: cases.Case, mode: cases.Mode) -> dict:
    """One case in one mode, timed. A client error (an HTTP error status through an SDK, a dropped connection, a
    response the client cannot parse, a stream an SDK helper cannot assemble) is the case's ``fail``, with the error
    as evidence."""
    t0 = time.perf_counter()
    try:
        out = case.run(ctx, mode)
    except (openai.APIStatusError, anthropic.APIStatusError) as exc:
        out = cases.Outcome(cases.FAIL, f"HTTP {exc.status_code}: {str(exc.message)[:240]}")
    except (openai.APIError, anthropic.APIError, httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        out = cases.Outcome(cases.FAIL, f"{type(exc).__name__}: {str(exc)[:240]}")
    except AssertionError as exc:
        # The SDKs' stream helpers assert on events they need: anthropic's MessageStream.get_final_message asserts
        # that a message_start came (anthropic/lib/streaming/_messages.py). A server that omits it fails the case;
        # it must not end the run with a traceback.
        detail = f": {str(exc)[:160]}" if str(exc) else ""
        out = cases.Outcome(cases.FAIL, NO_MESSAGE_START_SDK.format(detail=detail))
    return {"case": case.name, "api": case.api, "mode": mode.label, "verdict": out.verdict,
            "evidence": out.evidence, "seconds": round(time.perf_counter() - t0, 3)}


def run_matrix(ctx: cases.Context, chosen: list[cases.Case], on_result=None) -> list[dict]:
    """Every chosen case in each of its modes, in order; `on_result(result)` after each."""
    results = []
    for case in chosen:
        for mode in case.modes:
            res = run_case(ctx, case, mode)
            results.append(res)
            if on_result is not None:
                on_result(res)
    return results


def _slug(url: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "-", urlsplit(url).netloc).strip("-")


# Headers the key options own: a key given as a header would bypass --key-file's checks and land in shell history.
KEY_HEADERS = ("authorization", "x-api-key")


def parse_headers(values: list[str]) -> dict[str, str]:
    """``--header 'Name: value'`` options as a mapping (RFC 9110 field names: letters, digits and ``!#$%&'*+-.^_`|~``).

    Raises:
        UserError: a value without ``:``, an invalid name, or a key header (`KEY_HEADERS`).
    """
    out = {}
    for v in values:
        name, sep, value = v.partition(":")
        name = name.strip()
        if not sep or not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name):
            raise UserError(f"--header {name or v!r} is not 'Name: value'",
                            "pass e.g. --header 'x-claude-code-session-id: matrix-1'")
        if not re.fullmatch(r"[\x20-\x7e\t]*", value):
            raise UserError(f"--header {name}: the value holds a line break or a byte outside printable ASCII",
                            "pass one line of printable ASCII as the value")
        if name.lower() in KEY_HEADERS:
            raise UserError(f"--header {name}: the key is not passed as a header",
                            "put the key in a file (VLLM_API_KEY=<key>, mode 0600) and pass --key-file")
        out[name] = value.strip()
    return out


def run_conformance(ns: argparse.Namespace) -> int:
    """Entry point of `ds4deploy conformance`. Returns 0 (no case failed) or 1; UserError (exit 2) when the
    server cannot be tested."""
    from rich.console import Console

    if not ns.recipe and not ns.url:
        raise UserError("no server to test", "name a recipe (`ds4deploy conformance cpu`) or pass --url and "
                        "--key-file")
    headers = parse_headers(ns.header or [])
    recipe = load_recipe(ns.recipe) if ns.recipe else None
    url = (ns.url or base_url(recipe.serving.bind_address, recipe.serving.port)).rstrip("/")
    url = url.removesuffix("/v1")
    key = read_key(recipe, ns.key_file) if (recipe is not None or ns.key_file) else None
    chosen = select(ns.only)
    shapes = load_shapes(Path(ns.shapes) if ns.shapes else None)
    model, ctx_len, served_family = probe_server(url, key, ns.model or (recipe.model.served_name if recipe else None))
    # The family whose rules judge the matrix: the recipe's, else what the server's /v1/models says, else vLLM's.
    family = recipe.engine.family if recipe else served_family or "vllm"
    rules = engine_rules.rules_for(family)
    loopback, bind_source = bind_of(recipe, url)
    thinking = (recipe.benchmark if recipe else Benchmark()).thinking_kwargs
    ctx = cases.Context(url=url, key=key, model=model,
                        max_model_len=ctx_len or (recipe.serving.max_model_len if recipe else None),
                        thinking_kwargs=thinking, bind_loopback=loopback, bind_source=bind_source, shapes=shapes,
                        timeout_s=ns.timeout, headers=headers)
    console = Console(width=ns.width)
    meta = {
        "target": recipe.name if recipe else url, "recipe": recipe.name if recipe else None,
        "recipe_sha256": _recipe_sha(recipe), "url": url, "server_version": _version(url, key, family, recipe),
        "engine_family": family, "engine_rules": rules.engine,
        "model": model, "max_model_len": ctx.max_model_len,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores, Python "
                f"{platform.python_version()})",
        "clients": _clients(), "shapes": [s.name for s in shapes],
    }
    t0 = time.perf_counter()
    try:
        with console.status("conformance") as status:
            raw = run_matrix(ctx, chosen, lambda r: status.update(f"{r['case']} {r['mode']}: {r['verdict']}"))
    finally:
        ctx.close()
    # Judged by the family's own rules: what its engine forces, what is the model's choice on it, its named
    # differences from vLLM (engine_rules); every re-judged row keeps the case's own verdict as raw_verdict.
    results = engine_rules.apply(family, raw)
    meta["duration_s"] = round(time.perf_counter() - t0, 1)
    console.print(report.table(meta, results))
    console.print(report.summary_line(meta, results))
    console.print(report.mode_line(results))
    out = Path(ns.out) if ns.out else RESULTS_DIR / "conformance" / (recipe.name if recipe else _slug(url))
    docs = {c.name: c.doc for c in chosen}
    for path in report.write(out, meta, results, docs, rules):
        console.print(f"wrote {path}")
    return report.exit_code(results)


def _version(url: str, key: str | None, family: str, recipe: Recipe | None) -> str:
    """`server_version`, or for llama-server (no /version route) ``llama.cpp`` and the recipe's pinned commit."""
    v = server_version(url, key)
    if v == "unknown" and family == "llamacpp":
        return "llama.cpp" + (f" {recipe.engine.version.removeprefix('git-')[:12]} (the recipe's pin)"
                              if recipe else "")
    return v


def _recipe_sha(recipe: Recipe | None) -> str | None:
    """sha256 of the recipe file's bytes (which recipe text the report was made against); None without a recipe."""
    return hashlib.sha256(recipe.source_path.read_bytes()).hexdigest() if recipe is not None else None
