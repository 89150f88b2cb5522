"""A gateway's rendered front door config made runnable by this host's nginx (Debian's nginx-light with
libnginx-mod-http-js, `make unit-tools`): tests/gateway/test_recipe.py checks it with `nginx -t`,
tests/unit/test_gateway_tokens.py and test_gateway_fallback.py serve with it (`door_before`)."""

from __future__ import annotations

import contextlib
import http.server
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ds4deploy.recipe.schema import GatewayRecipe
from ds4deploy.render import gateway
from ds4deploy.render.front_door import nginx_binary
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
JS_MODULE = Path("/usr/lib/nginx/modules/ngx_http_js_module.so")  # Debian's libnginx-mod-http-js (make unit-tools)


def local_door_conf(gw: GatewayRecipe, keys: dict[str, str], tmp_path: Path, listen: str,
                    swaps: tuple[tuple[str, str], ...] = ()) -> Path:
    """Write ``<tmp_path>/nginx.conf``: the committed render of `gw`'s front door with placeholder gateway and metrics
    keys (the entrypoint's substitution), the people maps of `keys` (person -> key) under ``<tmp_path>/people``, its
    pid file, access log and temp paths under `tmp_path`, ``listen <listen>;`` for the recipe's address, usage.js
    from images/proxy (where the image has it), then each (old, new) of `swaps`. Returns the file's path.

    Raises:
        AssertionError: a text to replace is not in the render (the render changed under the test).
    """
    maps = gateway.write_people_maps(gw, keys, tmp_path / "people")
    text = gateway.render(gw)["front-door.conf.template"]
    for old, new in (("${VLLM_API_KEY}", "ds4-" + "g" * 40), ("${DS4_METRICS_KEY}", "ds4m-" + "m" * 40),
                     (gateway.CONTAINER_PEOPLE_DIR, str(maps)), ("pid /run/nginx.pid;", f"pid {tmp_path}/p;"),
                     (f"listen {gw.bind_address}:{gw.port};", f"listen {listen};"),
                     ("access_log /dev/stdout", f"access_log {tmp_path}/a.log"),
                     ("js_path /etc/nginx/njs/;", f"js_path {REPO}/images/proxy/;"), *swaps):
        assert old in text, old
        text = text.replace(old, new)
    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        text = text.replace("http {", f"http {{\n    {kind}_temp_path {tmp_path}/{kind};", 1)
    path = tmp_path / "nginx.conf"
    path.write_text(text)
    return path


@contextlib.contextmanager
def door_before(gw: GatewayRecipe, router: type[http.server.BaseHTTPRequestHandler], keys: dict[str, str],
                tmp_path: Path) -> Iterator[tuple[str, Path, http.server.ThreadingHTTPServer]]:
    """`gw`'s front door (`local_door_conf`) served by this host's nginx on a free loopback port, its router upstream
    a local server answering with `router`; both stopped on exit.

    Yields:
        (the door's URL, its access log's path, the router server).
    Raises:
        pytest.fail: no nginx with the njs module here (`make unit-tools` installs them); AssertionError: nginx did
            not start (its error log quoted).
    """
    nginx = nginx_binary()
    if nginx is None or not JS_MODULE.is_file():
        pytest.fail("nginx with the njs module is needed here: run `make unit-tools` (root)")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), router)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = free_port()  # the recipe's own port may be in use
    conf = local_door_conf(gw, keys, tmp_path, f"127.0.0.1:{port}",
                           ((f"server 127.0.0.1:{gw.router_port};", f"server 127.0.0.1:{server.server_port};"),))
    cmd = [nginx, "-e", str(tmp_path / "e.log"), "-p", f"{tmp_path}/", "-c", str(conf)]
    # Daemonised: nginx's master keeps the inherited stdout and stderr, so they are not pipes (run would wait on them).
    p = subprocess.run([*cmd, "-g", "daemon on;"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    assert p.returncode == 0, (tmp_path / "e.log").read_text()
    try:
        yield f"http://127.0.0.1:{port}", tmp_path / "a.log", server
    finally:
        subprocess.run([*cmd, "-s", "quit"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        server.shutdown()
