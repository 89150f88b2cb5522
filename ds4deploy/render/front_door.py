"""The front door: an nginx reverse proxy that checks the API key on every route (docs/front-door.md).

`render.render` writes ``front-door.conf.template`` (from templates/front-door.conf.j2) for a recipe with
``serving.front_door``; the proxy image's entrypoint (images/proxy/entrypoint.sh) substitutes the key
(``${VLLM_API_KEY}``, read from the recipe's key file through the compose env_file) into a private copy at container
start, tests it with ``nginx -t`` and runs nginx. The committed render never holds the key. A deployment serving
behind a gateway also accepts the gateway's key (``${DS4_GATEWAY_KEY}``, from ``Recipe.gateway_key_file`` when that
file is present; the entrypoint drops its lines otherwise), so the gateway never needs the deployment's own key.

The error bodies follow the API the route belongs to: Anthropic's shape for ``/v1/messages`` (Anthropic API docs,
"Errors": ``{"type": "error", "error": {"type": ..., "message": ...}}``), OpenAI's for everything else (OpenAI API
reference, "Error codes": ``{"error": {"message", "type", "param", "code"}}``).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ds4deploy.core.errors import UserError
from ds4deploy.recipe.schema import Recipe

# Built from images/proxy/Dockerfile on the recipe's Debian base (nginx-light from Debian bookworm).
IMAGE = "ds4deploy/front-door:nginx-bookworm"
# Where the compose service mounts the rendered template and where the entrypoint writes the keyed config.
TEMPLATE_FILE = "front-door.conf.template"
CONTAINER_TEMPLATE = "/etc/ds4deploy/front-door.conf.template"
# Path prefixes of the Anthropic API vLLM serves (/v1/messages, /v1/messages/count_tokens).
ANTHROPIC_PREFIXES = ("/v1/messages",)

# HTTP status -> (OpenAI type, OpenAI code, Anthropic type, message). Anthropic types from its "Errors" page
# (authentication_error 401, request_too_large 413, api_error for 502 and 504). Only errors nginx itself produces
# are rewritten; the engine's own error responses pass through unchanged.
ERRORS: dict[int, tuple[str, str, str, str]] = {
    400: ("invalid_request_error", "bad_request", "invalid_request_error",
          "malformed request: the front door refused its request line or headers (a duplicate Authorization or "
          "Host header, an invalid Host)"),
    401: ("invalid_request_error", "invalid_api_key", "authentication_error",
          "missing or invalid API key: send it as Authorization: Bearer <key> or as x-api-key: <key>"),
    413: ("invalid_request_error", "request_too_large", "request_too_large",
          "request body larger than this server accepts"),
    502: ("server_error", "engine_unavailable", "api_error", "the engine behind the front door is not answering"),
    504: ("server_error", "engine_timeout", "api_error", "the engine did not answer in time"),
    # nginx's own code for request headers larger than large_client_header_buffers (8 KiB per line, 32 KiB in all
    # by default; https://nginx.org/en/docs/http/ngx_http_core_module.html#large_client_header_buffers); the client
    # is answered 400, as nginx does.
    494: ("invalid_request_error", "request_header_too_large", "invalid_request_error",
          "request headers larger than this server accepts (8 KiB per header line)"),
}
# What the client sees for an nginx-internal status (494 is answered as 400); every other status as itself.
CLIENT_STATUS = {494: 400}
# Errors nginx raises while it reads a request, before any route is chosen: handled at the server level.
REQUEST_ERRORS = (400, 494)


def error_body(status: int, api: str) -> str:
    """The JSON body the front door returns for `status` on a route of `api` ("openai" or "anthropic"). It is
    written into an nginx single-quoted string, so it holds no quote, backslash or ``$``."""
    oai_type, code, anth_type, message = ERRORS[status]
    if api == "anthropic":
        body: dict = {"type": "error", "error": {"type": anth_type, "message": message}}
    else:
        body = {"error": {"message": message, "type": oai_type, "param": None, "code": code}}
    return json.dumps(body, separators=(",", ":"))


def upstream(recipe: Recipe) -> str:
    """``host:port`` the proxy forwards to: the engine service on the compose network (bridge networking), or the
    engine's loopback port (host networking: proxy and engine share the host's network namespace)."""
    if recipe.serving.network_mode == "bridge":
        return f"engine:{recipe.engine_port}"
    return f"127.0.0.1:{recipe.engine_port}"


# Docker's embedded DNS server, which a container on a user-defined network (the compose network) asks for service
# names (Docker docs, "Networking overview", DNS services).
DOCKER_DNS = "127.0.0.11"


def resolver(recipe: Recipe) -> str | None:
    """The DNS server nginx asks for the engine's address at request time (bridge networking: Docker's, so a
    recreated engine container is found at its new address), or None (host networking: a fixed loopback
    address, kept in an ``upstream`` block with keep-alive connections)."""
    return DOCKER_DNS if recipe.serving.network_mode == "bridge" else None


def listen(recipe: Recipe) -> str:
    """nginx ``listen`` address of the proxy: the recipe's port on all interfaces of its own container (bridge:
    Docker publishes it on bind_address), or bind_address itself (host networking)."""
    from ds4deploy.core.net import url_host

    if recipe.serving.network_mode == "bridge":
        return str(recipe.serving.port)
    ip = ipaddress.ip_address(recipe.serving.bind_address)
    if ip.version == 6 and ip.is_unspecified:
        # nginx's [::] socket is IPv6 only by default (ipv6only=on, nginx docs: ngx_http_core_module `listen`):
        # the healthcheck's 127.0.0.1 and every IPv4 client would be refused. "::" (or 0::0) means every address.
        return f"[::]:{recipe.serving.port} ipv6only=off"
    return f"{url_host(recipe.serving.bind_address)}:{recipe.serving.port}"


def health_probe(recipe: Recipe) -> str:
    """Host the proxy's healthcheck probes from inside its container: loopback, or the bound address on host
    networking when it is a specific one."""
    from ipaddress import ip_address

    addr = recipe.serving.bind_address
    if recipe.serving.network_mode == "bridge" or ip_address(addr).is_unspecified:
        return "127.0.0.1"
    return addr


def context(recipe: Recipe) -> dict:
    """What templates/front-door.conf.j2 and front-door.service.j2 need."""
    fd = recipe.serving.front_door
    assert fd is not None
    return {
        "image": IMAGE,
        "listen": listen(recipe),
        "upstream": upstream(recipe),
        "resolver": resolver(recipe),
        # What proxy_pass names: the engine's address in a variable (resolved per request) or the upstream block.
        "engine_ref": "$ds4_engine" if resolver(recipe) else "engine",
        "allow": fd.allow,
        "anthropic_prefixes": ANTHROPIC_PREFIXES,
        "max_body_mib": recipe.max_body_mib,
        "read_timeout_s": fd.read_timeout_s,
        "errors": {s: {"openai": error_body(s, "openai"), "anthropic": error_body(s, "anthropic"),
                       "status": CLIENT_STATUS.get(s, s)} for s in ERRORS},
        "request_errors": REQUEST_ERRORS,
        "template_file": TEMPLATE_FILE,
        "container_template": CONTAINER_TEMPLATE,
        "probe": f"{health_probe(recipe)}/{recipe.serving.port}",
    }


# Where Debian's nginx-light installs nginx (the front door image's nginx, and what `make unit` installs); /usr/sbin
# is not on every user's PATH.
NGINX_PATHS = ("/usr/sbin/nginx",)
# A key of the characters the entrypoint admits (images/proxy/entrypoint.sh: A-Z a-z 0-9 _ -), for the check only.
_PLACEHOLDER_KEY = "ds4-render-check-0000000000000000000000000000"
NGINX_ABSENT = ("nginx is not installed on this host, so the rendered front door config was not checked with "
                "nginx -t here (the front door container still checks it at start; `apt-get install nginx-light` "
                "makes the render check it)")


def nginx_binary() -> str | None:
    """The nginx executable on this host (PATH, then `NGINX_PATHS`), or None."""
    found = shutil.which("nginx")
    if found:
        return found
    return next((p for p in NGINX_PATHS if os.access(p, os.X_OK)), None)


def nginx_check(recipe: Recipe, conf: str) -> str | None:
    """Check the rendered front door config (`conf`, the template text) with nginx's own parser, as the
    entrypoint will at container start: ``nginx -t`` on a private copy with a placeholder key, the upstream moved
    to loopback (the compose service name resolves only on the compose network), the listen address moved to a
    unix socket (nginx -t binds it) and the pid, log and temp paths moved into a temporary directory. Nothing
    outside that directory is written.

    Returns:
        None when nginx accepted it; `NGINX_ABSENT` when nginx is not installed (the caller says so).
    Raises:
        UserError: nginx rejects the config (its message, the recipe, the fix).
    """
    nginx = nginx_binary()
    if nginx is None:
        return NGINX_ABSENT
    with tempfile.TemporaryDirectory(prefix="ds4-nginx-t-") as d:
        tmp = Path(d)
        text = (conf.replace("${VLLM_API_KEY}", _PLACEHOLDER_KEY).replace("${DS4_METRICS_KEY}", _PLACEHOLDER_KEY + "m")
                .replace("${DS4_GATEWAY_KEY}", _PLACEHOLDER_KEY + "g"))
        text = text.replace("pid /run/nginx.pid;", f"pid {tmp}/nginx.pid;")
        text = re.sub(r"(?m)^(\s*server\s+)engine:(\d+);", r"\g<1>127.0.0.1:\2;", text)
        # nginx -t binds the listen sockets: the recipe's address may not exist here and its port may be taken (by
        # a running front door), so the copy listens on a socket in the temporary directory.
        text = re.sub(r"(?m)^(\s*listen\s+)[^;]+;", rf"\g<1>unix:{tmp}/listen.sock;", text)
        text = text.replace("access_log /dev/stdout ", f"access_log {tmp}/access.log ")
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            text = text.replace("http {", f"http {{\n    {kind}_temp_path {tmp}/{kind};", 1)
        (tmp / "nginx.conf").write_text(text, encoding="utf-8")
        try:
            p = subprocess.run([nginx, "-t", "-q", "-e", str(tmp / "error.log"), "-p", f"{tmp}/", "-c",
                                str(tmp / "nginx.conf")], capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UserError(f"could not run {nginx} -t on the front door config of '{recipe.name}': {exc}",
                            "check the nginx installation (nginx -V)") from None
        if p.returncode != 0:
            msg = " ".join(line.strip() for line in (p.stderr or p.stdout).splitlines() if "emerg" in line
                           or "error" in line or "test failed" in line) or (p.stderr or p.stdout).strip()
            msg = msg.replace(str(tmp), "<tmp>")
            raise UserError(f"recipe '{recipe.name}': nginx rejects the rendered front door config (nginx -t: "
                            f"{msg[-600:]}); the front door would refuse to start",
                            "fix serving.front_door in the recipe (allow, max_body_mib, read_timeout_s)")
    return None
