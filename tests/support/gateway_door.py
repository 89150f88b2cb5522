"""A gateway's rendered front door config made runnable by this host's nginx (Debian's nginx-light with
libnginx-mod-http-js, `make unit-tools`): tests/gateway/test_recipe.py checks it with `nginx -t`,
tests/unit/test_gateway_tokens.py serves with it."""

from __future__ import annotations

from pathlib import Path

from ds4deploy.recipe.schema import GatewayRecipe
from ds4deploy.render import gateway

REPO = Path(__file__).resolve().parents[2]


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
