"""Bad input, round 3 (issue 26): the twelve handed cases as regression tests, through the real CLI.

Each case under fixtures/bad_input_3/<case>/ holds the input as it was handed (its `cmd` and `expect` files say what
was run and what a careful user expects). Every case must end with one message naming the cause and the fix, a
non-zero exit, no traceback, nothing written, and no secret in any file or message; i09 may instead succeed with
the mirror's credentials left out of the committed lock. The case folder is copied to a scratch directory first and
the CLI runs from that scratch directory, not from the checkout (so `extends: recipes/cpu.yaml` is resolved beside
the recipe or from the project root, never from the current directory).
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

CASES = Path(__file__).parent / "fixtures" / "bad_input_3"


def files_under(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")} if path.exists() else set()


@pytest.fixture
def case(tmp_path):
    """A function copying case `name` into the scratch directory and running the CLI there; returns (process, case
    copy, compose output directory, files of the copy before the run)."""

    def run(name: str, *args: str, recipes_dir: str | None = None, timeout: int = 120):
        work = tmp_path / name
        shutil.copytree(CASES / name, work)
        before = files_under(work)
        env = {**os.environ, "DS4_COMPOSE_DIR": str(tmp_path / "out"), "DS4_CACHE_DIR": str(tmp_path / "cache")}
        if recipes_dir is not None:
            env["DS4_RECIPES_DIR"] = str(work / recipes_dir)
        argv = [a.replace("$CASE", str(work)) for a in args]
        p = subprocess.run([sys.executable, "-m", "ds4deploy.cli", *argv], capture_output=True, text=True, env=env,
                           cwd=tmp_path, check=False, timeout=timeout)
        return p, work, tmp_path / "out", before

    return run


def refused(p: subprocess.CompletedProcess, *needles: str) -> None:
    """One clean refusal: exit 2, `error:` and `fix:` lines, every needle in the message, no traceback."""
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr + p.stdout
    assert "error: " in p.stderr and "\nfix: " in p.stderr
    for needle in needles:
        assert needle in p.stderr, (needle, p.stderr)


@pytest.mark.parametrize(("name", "args", "needles"), [
    ("a01-alias-duplicate", ["render", "$CASE/a01.yaml"],
     ["model.aliases[1] 'claude-sonnet-4-5' is already model.aliases[0]"]),
    ("f01-allow-duplicate", ["render", "$CASE/f01.yaml"],
     ["serving.front_door.allow lists /health more than once", "nginx refuses two 'location ='"]),
    ("m15-model-path-dotdot", ["render", "$CASE/m15.yaml"],
     ["model.path = '/var/lib/ds4deploy/models/../../../../etc'", "climbs out with '..'"]),
    ("n12-recipe-rail-netdev-metachar", ["render", "$CASE/n12.yaml"],
     ["fabric.rails[0].netdev = 'enp1s0f1np1 $(reboot)'", "fabric.rails[1].netdev = 'enP2p1s0f1np1;id'",
      "no shell metacharacter"]),
    ("s01-credential-under-plain-name", ["render", "$CASE/s01.yaml"],
     ["engine.env.OPENAI_KEY: 'OPENAI_KEY' names a credential", "engine.env.HF_AUTH: 'HF_AUTH' names a credential"]),
    ("v01-variant-unknown-leaf-key", ["recipe", "validate", "$CASE/v01.yaml"],
     ["problem(s) in variant 'fast'", "serving.max_num_seqz = 8: Extra inputs are not permitted"]),
    ("v01-variant-unknown-leaf-key", ["render", "$CASE/v01.yaml"], ["variant 'fast'", "serving.max_num_seqz"]),
    ("y06-billion-laughs", ["render", "$CASE/y06.yaml"], ["aliases (*name) expand to more than"]),
], ids=lambda v: v if isinstance(v, str) and "-" in v and "/" not in v else None)
def test_recipe_cases_are_refused_before_anything_is_written(case, name, args, needles):
    p, work, out, before = case(name, *args)
    refused(p, *needles)
    assert not out.exists(), "a refused render wrote files"
    assert files_under(work) == before
    assert "9f8e7d6c5b4a" not in p.stderr and "Zm9vOmJhcg" not in p.stderr  # s01: no secret in the message


def test_v02_variant_that_is_not_a_mapping(case):
    p, work, out, before = case("v02-variant-value-not-mapping", "render", "v02--fast", recipes_dir=".")
    refused(p, "variants.fast is int 3, not a mapping of dotted key paths to values", "variants: {fast:")
    assert not out.exists() and files_under(work) == before


def test_i05_lock_entry_that_is_a_string(case, tmp_path):
    p, work, _, before = case("i05-lock-entry-is-string", "image", "lock", "i05", "--artifact",
                              "LVLLMDS4X=$CASE/w.whl", recipes_dir=".")
    refused(p, "i05.lock.json: artifacts.LVLLMDS4X is str '0000", "not a mapping {file, url, size, sha256}",
            "run `ds4deploy image lock i05`")
    assert files_under(work) == before
    assert not (tmp_path / "cache").exists(), "the artifact was copied into the cache before the lock was read"


def test_m04_split_gguf_with_a_missing_part(case):
    p, work, _, before = case("m04-local-split-gguf-missing-part", "model", "lock", "m04", "--from", "$CASE/parts",
                              recipes_dir=".")
    refused(p, "split GGUF DeepSeek-IQ2: part(s) 00002-of-00003 missing (2 of 3 present)")
    assert files_under(work) == before  # no m04.manifest.json


def test_x02_recipe_index_over_an_invalid_manifest(case):
    p, work, _, before = case("x02-recipe-index-bad-manifest", "recipe", "index", recipes_dir="recipes")
    refused(p, "cpu.manifest.json is not valid JSON", "ds4deploy model lock cpu")
    assert files_under(work) == before  # no recipes/README.md


@pytest.fixture
def mirror(tmp_path):
    """A real HTTP server on 127.0.0.1 serving the i09 case's srv/ folder (the mirror); yields its port."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(CASES / "i09-artifact-url-with-"
                                                                                    "password" / "srv"))
    handler.log_message = lambda *a: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_i09_mirror_password_never_reaches_the_lock_or_a_message(case, mirror, tmp_path):
    wheel = "lvllmds4_x-2.3.8-cp312-cp312-manylinux_2_34_x86_64.whl"
    url = f"http://mirror:hunter2pass@127.0.0.1:{mirror}/{wheel}"
    p, work, _, _ = case("i09-artifact-url-with-password", "image", "lock", "i09", "--artifact", f"LVLLMDS4X={url}",
                         recipes_dir=".")
    assert p.returncode == 0, p.stderr
    lock = (work / "i09.lock.json").read_text()
    assert "hunter2pass" not in lock and "mirror:" not in lock
    assert f'"url": "http://127.0.0.1:{mirror}/{wheel}"' in lock
    # The same mirror, a file it does not have: the message names the URL without the credentials.
    bad = f"http://mirror:hunter2pass@127.0.0.1:{mirror}/missing.whl"
    env = {**os.environ, "DS4_RECIPES_DIR": str(work), "DS4_CACHE_DIR": str(tmp_path / "cache2")}
    (work / "i09.lock.json").unlink()
    q = subprocess.run([sys.executable, "-m", "ds4deploy.cli", "image", "lock", "i09", "--artifact",
                        f"LVLLMDS4X={bad}"], capture_output=True, text=True, env=env, check=False, timeout=120)
    refused(q, f"could not download http://127.0.0.1:{mirror}/missing.whl: HTTP 404")
    assert "hunter2pass" not in q.stderr + q.stdout
    assert not (work / "i09.lock.json").exists()


# --- each kind, beyond the handed file ---------------------------------------------------------------------------
# (Each of these failed on the code before issue 26: a traceback, a hang, a secret written, or a silent acceptance.)

import json  # noqa: E402
import time  # noqa: E402

import yaml  # noqa: E402

from ds4deploy.core.errors import UserError  # noqa: E402
from ds4deploy.core.secret_scan import find_secrets, redact, strip_userinfo  # noqa: E402
from ds4deploy.core.yamlio import MAX_DEPTH, parse_json, parse_strict  # noqa: E402
from ds4deploy.model.manifest import check_manifest, split_gguf_problems  # noqa: E402
from ds4deploy.plan.inventory import missing_collection  # noqa: E402
from ds4deploy.recipe.load import load_recipe  # noqa: E402
from ds4deploy.render import compose as render  # noqa: E402
from ds4deploy.render import front_door  # noqa: E402
from tests.unit.conftest import REPO, run_cli, write_variant  # noqa: E402


def test_deep_nesting_is_refused_not_a_recursion_error():
    for text in ("[" * 5000 + "]" * 5000, "a: " + "{b: " * 200 + "1" + "}" * 200):
        with pytest.raises(UserError, match=f"nested more than {MAX_DEPTH} levels deep"):
            parse_strict(text, "deep.yaml")
    with pytest.raises(UserError, match="nested 5000 levels deep"):
        parse_json("[" * 5000 + "]" * 5000, "deep.json", "fix it")


def test_alias_bomb_is_refused_from_the_event_stream():
    bomb = (CASES / "y06-billion-laughs" / "y06.yaml").read_text()
    with pytest.raises(UserError, match="an alias bomb"):
        parse_strict(bomb, "y06.yaml")
    # Aliases themselves are legal: a small document using them reads as PyYAML reads it.
    assert parse_strict("a: &x [1, 2]\nb: *x\n", "ok.yaml").data == {"a": [1, 2], "b": [1, 2]}


def test_merge_key_override_is_not_a_duplicate_but_a_real_duplicate_is():
    doc = parse_strict("base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n", "m.yaml")
    assert doc.data["c"] == {"x": 3, "y": 2}
    with pytest.raises(UserError, match="key 'x' is written twice, at lines 3 and 4"):
        parse_strict("c:\n  <<: {x: 1}\n  x: 2\n  x: 3\n", "m.yaml")


def test_keys_one_and_true_are_reported_as_written():
    with pytest.raises(UserError) as exc:
        parse_strict("variants:\n  1: {}\n  true: {}\n", "k.yaml")
    assert "keys '1' and 'true' are one key to the reader" in exc.value.cause
    assert "'True'" not in exc.value.cause


def test_unquoted_hex_revision_gets_the_advice_to_quote_it(recipe_dir):
    text = (recipe_dir / "cpu.yaml").read_text().replace("  source: generated", "  source: generated\n"
                                                         "  revision: 0x1f2e3d4c", 1)
    (recipe_dir / "hexrev.yaml").write_text(text.replace("name: cpu", "name: hexrev", 1))
    with pytest.raises(UserError) as exc:
        load_recipe("hexrev")
    assert "written unquoted as 0x1f2e3d4c, which YAML reads as the integer 523124044: quote it, '0x1f2e3d4c'" in \
        exc.value.cause
    (recipe_dir / "hexrev.yaml").write_text(text.replace("name: cpu", "name: hexrev", 1).replace("0x1f2e3d4c",
                                                                                                 "1234567"))
    with pytest.raises(UserError, match="written unquoted as 1234567, which YAML reads as the integer 1234567"):
        load_recipe("hexrev")


def test_extends_is_resolved_beside_the_recipe_not_from_the_current_directory(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(REPO / "recipes" / "cpu.yaml", site / "base.yaml")
    (site / "base.yaml").write_text((site / "base.yaml").read_text().replace("name: cpu", "name: base", 1))
    (site / "child.yaml").write_text("extends: base.yaml\nname: child\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_recipe(str(site / "child.yaml")).name == "child"


def test_secrets_by_shape():
    hits = find_secrets({"engine": {"env": {"HF_AUTH": "x1", "DB_PASSWORD": "x", "MY_TOKEN": "t", "LOG_LEVEL": "x"}},
                         "serving": {"extra_args": {"headers": '{"Authorization": "Basic Zm9vOmJhcg=="}'}},
                         "entrypoint": ["-H", "Proxy-Authorization: Bearer abc.def"],
                         "mirror": "https://user:pw@mirror.example/x", "token_user": "https://ghp@host/x",
                         "blob": "value aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1x"})
    text = "\n".join(hits)
    for where in ("HF_AUTH", "DB_PASSWORD", "MY_TOKEN", "serving.extra_args.headers", "entrypoint[1]", "mirror",
                  "token_user", "blob"):
        assert where in text, where
    assert "LOG_LEVEL" not in text
    # What the recipes pin is not a secret: digests, revisions, versions, wheel names, model names, auth settings.
    for recipe in ("cpu", "v100x8-ds41-flash-iq2", "rtx3090x2-xeon-ds4-flash", "gx10x2-ds4-flash-fp8"):
        assert find_secrets(yaml.safe_load((REPO / "recipes" / f"{recipe}.yaml").read_text())) == [], recipe


def test_userinfo_is_stripped_and_messages_are_redacted():
    assert strip_userinfo("http://u:p@h:1/x?y=1") == "http://h:1/x?y=1"
    assert strip_userinfo("https://h/x") == "https://h/x"
    out = redact("could not fetch https://u:hunter2@h/x with hf_abcdefghijklmnopqrstuvwxyz12")
    assert "hunter2" not in out and "hf_abcdef" not in out and "https://h/x" in out


def test_front_door_settings_are_validated_in_the_schema(recipe_dir):
    for fd, needle in (({"allow": []}, "must include /health"),
                       ({"max_body_mib": 10**12}, "less than or equal to 1024"),
                       ({"read_timeout_s": 10**12}, "less than or equal to 86400")):
        write_variant(recipe_dir, "fd", lambda d, fd=fd: d["serving"].update(front_door=fd))
        with pytest.raises(UserError, match=needle):
            load_recipe("fd")


@pytest.mark.skipif(front_door.nginx_binary() is None, reason="nginx not installed (make unit installs it)")
def test_rendered_front_door_is_checked_by_nginx_itself():
    r = load_recipe("cpu")
    text = render.render(r).files[front_door.TEMPLATE_FILE]
    assert front_door.nginx_check(r, text) is None
    at = text.index("location = /health")
    twice = text[:at] + "location = /health { return 200; }\n        " + text[at:]
    with pytest.raises(UserError, match=r'nginx -t: nginx: \[emerg\] duplicate location "/health"'):
        front_door.nginx_check(r, twice)


def test_without_nginx_the_render_says_it_did_not_check(monkeypatch):
    monkeypatch.setattr(front_door, "nginx_binary", lambda: None)
    out = render.render(load_recipe("cpu"))
    assert out.notes == (f"cpu: {front_door.NGINX_ABSENT}",)
    assert "nginx is not installed on this host" in out.notes[0]


def test_split_gguf_rules():
    assert split_gguf_problems(["m-00001-of-00002.gguf", "m-00002-of-00002.gguf", "other.gguf"]) == []
    assert split_gguf_problems(["m-00001-of-00005.gguf"]) == [
        "split GGUF m: part(s) 00002-of-00005, 00003-of-00005, 00004-of-00005, 00005-of-00005 missing (1 of 5 "
        "present); the engine opens part 1 and reads every other part"]
    dangling = split_gguf_problems(["m-00001-of-00002.gguf", "m-00002-of-00002.gguf", "m-00003-of-00002.gguf"])
    assert dangling == ["split GGUF m: part 00003-of-00002 is numbered past its count (a dangling part)"]
    assert "disagree on the count" in split_gguf_problems(["m-00001-of-00002.gguf", "m-00002-of-00003.gguf"])[0]
    entry = {"size": 1, "sha256": "0" * 64}
    with pytest.raises(UserError, match="split GGUF m: part"):
        check_manifest({"files": {"m-00001-of-00003.gguf": entry, "m-00003-of-00003.gguf": entry}})


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda d: d["model"].update(path="/"), "is the root or a system directory"),
    (lambda d: d["model"].update(path="/var/lib/ds4deploy/models/./x"), "a '.' folder"),
    (lambda d: d["model"].update(aliases=["ds4-tiny"]), "model.aliases[0] 'ds4-tiny' is already model.served_name"),
])
def test_model_rules(recipe_dir, edit, needle):
    write_variant(recipe_dir, "m", edit)
    with pytest.raises(UserError) as exc:
        load_recipe("m")
    assert needle in exc.value.cause


def test_recipe_hca_names_follow_the_inventory_rule(recipe_dir):
    data = yaml.safe_load((REPO / "recipes" / "gx10x2-ds4-flash-fp8.yaml").read_text())
    data["fabric"]["rails"][0]["hcas"] = ["rocep1s0f1`id`"]
    (recipe_dir / "gx10x2-ds4-flash-fp8.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(UserError) as exc:
        load_recipe("gx10x2-ds4-flash-fp8")
    assert "fabric.rails[0].hcas[0] = 'rocep1s0f1`id`'" in exc.value.cause
    assert "not an RDMA device name" in exc.value.cause


def test_a_lock_naming_another_recipe_or_image_is_not_up_to_date(tmp_path):
    d = tmp_path / "recipes"
    shutil.copytree(CASES / "i05-lock-entry-is-string", d)
    good = {"file": "lvllmds4_x-2.3.8-cp312-cp312-manylinux_2_34_x86_64.whl", "url": "https://h/x.whl", "size": 12,
            "sha256": "0" * 64}
    for lock, needle in (({"recipe": "other", "image": "sm86"}, "locks recipe 'other', but recipe 'i05'"),
                         ({"recipe": "i05", "image": "sm70"}, "locks image 'sm70', but recipe 'i05' is image 'sm86'")):
        (d / "i05.lock.json").write_text(json.dumps({**lock, "artifacts": {"LVLLMDS4X": good}}))
        p = run_cli("image", "lock", "i05", "--artifact", f"LVLLMDS4X={d / 'w.whl'}", env_dir=d)
        refused(p, needle)


def test_a_manifest_naming_another_recipe_is_refused(recipe_dir):
    m = json.loads((recipe_dir / "cpu.manifest.json").read_text())
    (recipe_dir / "cpu.manifest.json").write_text(json.dumps({**m, "recipe": "gx10x2-ds4-flash-fp8"}))
    from ds4deploy.model.manifest import load_manifest

    with pytest.raises(UserError, match="records the model of recipe 'gx10x2-ds4-flash-fp8', not of 'cpu'"):
        load_manifest(load_recipe("cpu"))


def test_an_artifact_name_cannot_leave_the_cache(tmp_path):
    d = tmp_path / "recipes"
    shutil.copytree(CASES / "i05-lock-entry-is-string", d)
    text = (d / "i05.yaml").read_text().replace("LVLLMDS4X_WHEEL: lvllmds4_x", "LVLLMDS4X_WHEEL: ../../x/lvllmds4_x")
    (d / "i05.yaml").write_text(text)
    (d / "i05.lock.json").unlink()
    p = run_cli("image", "lock", "i05", "--artifact", f"LVLLMDS4X={d / 'w.whl'}", env_dir=d)
    refused(p, "an artifact file name must be one plain file name")
    assert not (d / "i05.lock.json").exists()


def test_recipe_index_refuses_a_broken_variant_and_writes_nothing(recipe_dir):
    write_variant(recipe_dir, "broken", lambda d: d.update(variants={"fast": {"serving.max_num_seqz": 8}}))
    p = run_cli("recipe", "index", env_dir=recipe_dir)
    refused(p, "variant 'fast'", "serving.max_num_seqz")
    assert not (recipe_dir / "README.md").exists()


def test_a_missing_ansible_collection_is_named_with_its_install_command():
    # ansible-core 2.19's own lines for ANSIBLE_STDOUT_CALLBACK=ansible.posix.json without the collection.
    out = ("[WARNING]: Error loading plugin 'ansible.posix.json': No module named 'ansible_collections.ansible'\n"
           "[ERROR]: Could not load 'ansible.posix.json' callback plugin.\n")
    err = missing_collection(out)
    assert err is not None
    assert "the Ansible collection ansible.posix is not installed" in err.cause
    assert "ansible-galaxy collection install ansible.posix" in err.fix
    assert missing_collection("[ERROR]: Could not load 'ansible.builtin.default' callback plugin.") is None


def test_a_capture_size_written_as_a_string_is_read_as_the_number():
    from ds4deploy.plan import preflight
    from tests.unit.test_preflight import mutate, verdict

    r = load_recipe("gx10x2-ds4-flash-fp8")
    want = r.serving.extra_args["max-cudagraph-capture-size"]
    quoted = mutate("gx10x2-ds4-flash-fp8", "serving.extra_args", {**r.serving.extra_args,
                                                                   "max-cudagraph-capture-size": str(want)})
    v = verdict(quoted, "cudagraph-capture-size")
    assert v.status == "pass", v
    words = mutate("gx10x2-ds4-flash-fp8", "serving.extra_args", {**r.serving.extra_args,
                                                                  "max-cudagraph-capture-size": "six"})
    v = verdict(words, "cudagraph-capture-size")
    assert v.status == "fail" and "'six' is not a whole number" in str(v)
    assert preflight is not None


def test_every_reader_refuses_quickly_with_one_message():
    """The bound each reader applies holds for the handed bomb: refused in well under a second of work (a guard
    against a hang, not a speed target: the old reader never returned)."""
    start = time.process_time()
    with pytest.raises(UserError):
        parse_strict((CASES / "y06-billion-laughs" / "y06.yaml").read_text(), "y06.yaml")
    assert time.process_time() - start < 5


def test_printed_errors_keep_paths_and_mask_tokens_in_them():
    """Every printed error goes through `redact`: an incident folder, a cache digest and a timestamped name in a path
    stay readable (the cause must be findable), a token-shaped path component and free-standing tokens, '/' in them
    or not, are masked."""
    from ds4deploy.core.secret_scan import redact

    folder = "/var/lib/ds4deploy/incidents/cpu-2node-tp/20261201T161530Z-engine-down/node-a.log"
    digest = "/root/.cache/ds4deploy/artifacts/" + "832db069" * 8 + "/llama_cpp_python-0.3.36.tar.gz"
    assert redact(f"cannot read {folder}") == f"cannot read {folder}"
    assert redact(digest) == digest
    fake = "Q7fz9KpL2mXw4RtY8vBn6cHj3dGs5aEu"  # a made-up random run
    assert redact(f"/tmp/x/{fake}/recipe.yaml") == "/tmp/x/<redacted>/recipe.yaml"
    slashed = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY9z"  # base64 with '/', not a path
    assert redact(f"secret {slashed} and sk-{fake}") == "secret <redacted> and <redacted>"
