"""Bad gateway input found by fuzzing the gateway recipe, its people key file and the deploy's report (2026-12-03):
each refused with one message naming the cause and the fix, exit 2 through the CLI, nothing written, no key in the
render or the message; and the renders a user may ask for outside the repository ($DS4_COMPOSE_DIR) written there.

Every case is a mutation of a committed gateway recipe (recipes/gateways/office.yaml, loopback.yaml) loaded the way
`ds4deploy gateway render` loads it (`load_gateway`), so a case passes only while the check it names is in place.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ds4deploy.core.errors import UserError
from ds4deploy.core.keys import KEY_MAX_CHARS
from ds4deploy.recipe.paths import REPO_ROOT
from ds4deploy.render import gateway

GATEWAYS = REPO_ROOT / "recipes" / "gateways"
KEY_A = "ds4p-" + "a" * 40


def _doc(name: str) -> dict:
    return yaml.safe_load((GATEWAYS / f"{name}.yaml").read_text())


def _write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _set(doc: dict, dotted: str, value) -> dict:
    """`doc` with the value at `dotted` (``backends.0.url``) replaced."""
    out = copy.deepcopy(doc)
    *parents, last = dotted.split(".")
    node = out
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    node[int(last) if isinstance(node, list) else last] = value
    return out


def _loopback_with_nginx(**changes) -> dict:
    """The loopback gateway as an nginx router of one model (a and b), then `changes` (dotted path -> value)."""
    doc = _doc("loopback")
    doc["routing"] = {"router": "nginx", "session_header": "x-claude-code-session-id"}
    doc.pop("router_port"), doc.pop("router_metrics_port"), doc.pop("fallback")
    doc["models"], doc["backends"] = ["office-tiny"], doc["backends"][:2]
    for k, v in changes.items():
        doc = _set(doc, k, v)
    return doc


REFUSED = {
    # Session headers that carry a credential would write each person's key into every access log line.
    "authorization as session header": (_set(_doc("office"), "routing.session_header", "authorization"),
                                        "carries a credential"),
    "x-api-key as session header": (_set(_doc("office"), "routing.session_header", "x-api-key"),
                                    "carries a credential"),
    "cookie as session header": (_set(_doc("office"), "routing.session_header", "cookie"), "carries a credential"),
    "x-auth-token as session header": (_set(_doc("office"), "routing.session_header", "x-auth-token"),
                                       "carries a credential"),
    # URLs the old regex let through and nginx (or the deploy's probe) refused later.
    "port 0": (_loopback_with_nginx(**{"backends.0.url": "http://127.0.0.1:0"}), "outside 1-65535"),
    "port 65536": (_loopback_with_nginx(**{"backends.0.url": "http://127.0.0.1:65536"}), "outside 1-65535"),
    "IPv6 without brackets": (_loopback_with_nginx(**{"backends.0.url": "http://::1:18121"}),
                              "not http://<host>:<port>"),
    "brackets of nonsense": (_loopback_with_nginx(**{"backends.0.url": "http://]]:[[:18121"}),
                             "not http://<host>:<port>"),
    "two ports": (_loopback_with_nginx(**{"backends.0.url": "http://1.2.3.4:5:6"}), "not http://<host>:<port>"),
    "dash host": (_loopback_with_nginx(**{"backends.0.url": "http://-:18121"}), "neither an IP address"),
    "999 address": (_loopback_with_nginx(**{"backends.0.url": "http://999.1.1.1:18121"}), "not an IPv4 address"),
    "bracketed IPv4": (_loopback_with_nginx(**{"backends.0.url": "http://[127.0.0.1]:18121"}),
                       "in brackets is not an IPv6 address"),
    "empty label host": (_set(_doc("office"), "backends.0.host", "a..b"), "neither an IP address"),
    "unspecified host": (_set(_doc("office"), "backends.0.host", "0.0.0.0"), "no server answers from it"),
    "scoped IPv6 host": (_set(_doc("office"), "backends.0.host", "fe80::1%eth0"), "zone index"),
    # Paths compose or nginx would refuse, or that collide with the files derived from them.
    "colon in people_key_file": (_set(_doc("office"), "people_key_file", "/etc/a:b.people"), "':'"),
    "dotdot in key_file": (_set(_doc("office"), "key_file", "/etc/ds4deploy/../shadow.env"), "climbs out"),
    "people file = metrics file": (_set(_set(_doc("office"), "key_file", "/k/m.env"), "people_key_file",
                                        "/k/m.metrics.env"), "are one path"),
    "people maps folder = key file": (_set(_set(_doc("office"), "key_file", "/k/a.d"), "people_key_file", "/k/a"),
                                      "are one path"),
    # A fallback parameter nginx cannot read.
    "fallback pairs too long": (_set(_set(_doc("loopback"), "models", ["office-tiny", "o" * 4100]),
                                     "fallback", {"o" * 4100: "office-tiny"}), "more than the 4000"),
    # One server listed twice, and the gateway as its own backend.
    "one URL twice": (_loopback_with_nginx(**{"backends.1.url": "http://127.0.0.1:18121"}), "are one server"),
    "one host twice": (_set(_doc("office"), "backends.1.host", "box-a.office.lan"), "are one server"),
    "one host twice, spelled twice": (_set(_doc("office"), "backends.1.host", "BOX-A.office.lan."), "are one server"),
    "key file in a system tree": (_set(_doc("office"), "key_file", "/usr/bin/gw.env"), "a system tree"),
    "key file a system folder": (_set(_doc("office"), "key_file", "/etc"), "is a system folder"),
    "people file straight in /etc": (_set(_doc("office"), "people_key_file", "/etc/gw.people"),
                                     "sits directly in /etc"),
    "multicast bind": (_set(_doc("office"), "bind_address", "224.0.0.1"), "a multicast or broadcast address"),
    "people file through a dot folder": (_set(_doc("office"), "people_key_file", "/etc/ds4deploy/./p.people"),
                                         "a '.' folder"),
    "the gateway itself": (_loopback_with_nginx(**{"backends.0.url": "http://127.0.0.1:18140"}),
                           "is the gateway itself"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_bad_gateway_recipes_are_refused(tmp_path: Path, case: str) -> None:
    doc, words = REFUSED[case]
    with pytest.raises(UserError) as exc:
        gateway.load_gateway(_write(tmp_path, doc))
    assert words in str(exc.value), str(exc.value)


def test_the_good_shapes_the_checks_refine_still_load(tmp_path: Path) -> None:
    """What the new checks must let through: an IPv6 url backend, a host name with a final dot, both committed
    gateways as they are."""
    for name in gateway.gateway_names():
        gateway.load_gateway(name)
    doc = _loopback_with_nginx(**{"backends.0.url": "http://[::1]:18121"})
    assert gateway.load_gateway(_write(tmp_path, doc)).backends[0].url == "http://[::1]:18121"
    gw = gateway.load_gateway(_write(tmp_path, _set(_doc("office"), "backends.0.host", "box-a.office.lan.")))
    assert gateway.resolve_backends(gw)[0].url == "http://box-a.office.lan.:8000"


def _cli(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ds4deploy.cli", *args], capture_output=True, text=True,
                          cwd=cwd, check=False, timeout=120, env={**os.environ, **(env or {})})


def _refused(p: subprocess.CompletedProcess, *words: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr + p.stdout and "\nfix: " in p.stderr, p.stderr
    for w in words:
        assert w in p.stderr, (w, p.stderr)


@pytest.mark.tool
def test_a_render_outside_the_repository_is_written_there(tmp_path: Path) -> None:
    """$DS4_COMPOSE_DIR outside the checkout: the render lands there and the command says so (it wrote the files,
    then failed with a traceback computing the path it printed)."""
    out = tmp_path / "compose"
    p = _cli("gateway", "render", "office", env={"DS4_COMPOSE_DIR": str(out)})
    assert p.returncode == 0, p.stderr
    assert "wrote compose/gateways/office/compose.yaml" in p.stdout
    assert (out / "gateways" / "office" / "compose.yaml").read_text() == (
        REPO_ROOT / "compose" / "gateways" / "office" / "compose.yaml").read_text()


@pytest.mark.tool
def test_a_render_folder_in_the_way_is_one_message(tmp_path: Path) -> None:
    """A file where the render's folder goes: refused, nothing written; a stray folder inside the render's folder
    (which is the render's) is replaced, not a traceback."""
    out = tmp_path / "compose"
    (out / "gateways").mkdir(parents=True)
    (out / "gateways" / "office").write_text("mine")
    _refused(_cli("gateway", "render", "office", env={"DS4_COMPOSE_DIR": str(out)}), "is not a directory")
    assert (out / "gateways" / "office").read_text() == "mine"
    (out / "gateways" / "office").unlink()
    (out / "gateways" / "office" / "stray.d").mkdir(parents=True)
    p = _cli("gateway", "render", "office", env={"DS4_COMPOSE_DIR": str(out)})
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in (out / "gateways" / "office").iterdir()) == sorted(
        x.name for x in (REPO_ROOT / "compose" / "gateways" / "office").iterdir())


@pytest.mark.tool
def test_a_gateway_recipe_given_to_stack_commands_says_so(tmp_path: Path) -> None:
    office = str(GATEWAYS / "office.yaml")
    for args in (("recipe", "validate", office), ("render", office), ("preflight", "office")):
        _refused(_cli(*args, env={"DS4_COMPOSE_DIR": str(tmp_path / "out")}), "is a gateway recipe",
                 "ds4deploy gateway render")
    _refused(_cli("gateway", "render", str(REPO_ROOT / "recipes" / "cpu.yaml"),
                  env={"DS4_COMPOSE_DIR": str(tmp_path / "out")}), "is a stack recipe")
    assert not (tmp_path / "out").exists()


def test_people_keys_a_bom_is_no_part_of_a_name_and_a_key_has_a_maximum(tmp_path: Path) -> None:
    gw = gateway.load_gateway("office")
    assert gateway.parse_people_keys(gw, f"\ufeffalice {KEY_A}\n", "p") == {"alice": KEY_A}
    longest = "k" * KEY_MAX_CHARS
    assert gateway.parse_people_keys(gw, f"alice {longest}\n", "p") == {"alice": longest}
    with pytest.raises(UserError, match=r"line 1 \('alice'\): the key is not 32 to 1024 characters") as exc:
        gateway.parse_people_keys(gw, f"alice {longest}k\n", "p")
    assert longest not in str(exc.value)


@pytest.mark.tool
def test_nginx_accepts_the_longest_key_in_the_people_maps(tmp_path: Path) -> None:
    """The maximum is one nginx reads: the maps of a key of KEY_MAX_CHARS characters pass `nginx -t` (a 5,000
    character key failed it with "too long parameter")."""
    import shutil

    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        pytest.skip("nginx is not installed (make unit-tools installs it)")
    maps = gateway.people_maps({"alice": "k" * KEY_MAX_CHARS})
    for name, text in maps.items():
        (tmp_path / name).write_text(text)
    conf = tmp_path / "nginx.conf"
    conf.write_text(f"pid {tmp_path}/nginx.pid; error_log stderr; events {{}} http {{ access_log off; "
                    f"map $http_authorization $p1 {{ default \"\"; include {tmp_path}/bearer.map; }} "
                    f"map $http_x_api_key $p2 {{ default \"\"; include {tmp_path}/x-api-key.map; }} }}\n")
    p = subprocess.run([nginx, "-t", "-q", "-c", str(conf), "-p", str(tmp_path)], capture_output=True, text=True,
                       check=False)
    assert p.returncode == 0, p.stderr


@pytest.mark.tool
def test_a_long_string_in_a_recipe_does_not_hang_the_secret_scan(tmp_path: Path) -> None:
    """The secret scan's URL shapes tried every start position of a long run of letters (20 KB: 5 s, quadratic; a
    200 KB description did not end in 120 s). A 400 KB description, in a gateway recipe and a stack recipe, now
    reaches the schema's verdict well inside the 60 s a hung command is given (the y06 case's bound)."""
    long = "x" * 400_000
    gw = _write(tmp_path, {**_doc("office"), "description": long})
    stack = tmp_path / "cpu.yaml"
    stack.write_text((REPO_ROOT / "recipes" / "cpu.yaml").read_text().replace(
        "description: >-\n", f"description: {long}\nold_description: >-\n", 1))
    for args in (("gateway", "render", str(gw)), ("recipe", "validate", str(stack))):
        try:
            p = subprocess.run([sys.executable, "-m", "ds4deploy.cli", *args], capture_output=True, text=True,
                               cwd=REPO_ROOT, check=False, timeout=60,
                               env={**os.environ, "DS4_COMPOSE_DIR": str(tmp_path / "out")})
        except subprocess.TimeoutExpired:
            pytest.fail(f"ds4deploy {' '.join(args[:2])} on a 400 KB description ran for more than 60 s")
        assert "Traceback" not in p.stderr, p.stderr
    # The stack recipe's extra key is refused, which shows the scan was passed and the schema reached.
    assert "old_description" in p.stderr


@pytest.mark.tool
def test_an_inventory_listing_hosts_as_a_list_is_ansibles_message(tmp_path: Path) -> None:
    """`hosts:` as a list (Ansible wants a mapping): Ansible's own refusal, not an AttributeError from the check of
    hosts defined twice (`ds4deploy.plan.inventory._conflicts`, shared with every stack command)."""
    inv = tmp_path / "inv.yml"
    inv.write_text("all:\n  children:\n    gateway:\n      hosts: [localhost]\n")
    _refused(_cli("gateway", "vars", "office", "--inventory", str(inv)), "Ansible cannot read the inventory")
