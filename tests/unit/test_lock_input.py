"""Bad input to `ds4deploy model lock --from` (a local model) and `ds4deploy image lock`, found by fuzzing after
round 3 (tests/unit/test_bad_input_3.py holds the handed cases of the same kinds), through the real CLI.

Each case must end with one message naming the cause and the fix (exit 2, `error:` and `fix:` lines, no traceback),
with nothing written: no manifest, no lock, no temporary file, no copy in the artifact cache, and no credential in
any message or file. Each ran to exit 0 (or a traceback) on the code before this file: a symbolic link out of the
--from folder hashed into the manifest, a manifest without the recipe's model.file, split parts named ``.GGUF``
with one missing, a token in an artifact URL's query or fragment written into the committed lock, a directory where
the lock goes or a file as DS4_CACHE_DIR (a traceback and a temporary file left), and a recipe's ftp:// build arg
blamed on the user's local file.

The CLI runs in a subprocess from a scratch directory, with PYTHONPATH set to this checkout (so a copy of it, such
as a git worktree of an older commit, tests its own code and not the installed one).
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
import yaml

from ds4deploy.model.manifest import split_gguf_problems

REPO = Path(__file__).resolve().parents[2]
M04 = REPO / "tests" / "unit" / "fixtures" / "bad_input_3" / "m04-local-split-gguf-missing-part" / "m04.yaml"
SM86 = "rtx3090x2-xeon-ds4-flash"  # the committed recipe whose image build downloads an artifact (LVLLMDS4X)
WHEEL = yaml.safe_load((REPO / "recipes" / f"{SM86}.yaml").read_text())["engine"]["image"]["build_args"][
    "LVLLMDS4X_WHEEL"]
# A made-up credential of GitHub's documented token shape (ghp_ and 36 letters/digits:
# https://github.blog/2021-04-05-behind-githubs-new-authentication-token-formats/), put together here so the literal
# is not itself one.
TOKEN = "ghp_" + "abcdefghijklmnopqrstuvwxyz" + "0123456789"
# The request limit of one CLI run; a lock of a few bytes takes about a second.
TIMEOUT_S = 120


def files_under(path: Path) -> dict[str, bytes | None]:
    """Every entry below `path` with its bytes (None for a directory or a link that leads nowhere)."""
    out = {}
    for p in sorted(path.rglob("*")):
        out[str(p.relative_to(path))] = p.read_bytes() if p.is_file() else None
    return out


@pytest.fixture
def cli(tmp_path):
    """Run the real CLI from `tmp_path/run` with scratch DS4_RECIPES_DIR (`tmp_path/recipes`), DS4_CACHE_DIR and
    DS4_COMPOSE_DIR; extra environment variables override those."""
    (tmp_path / "recipes").mkdir()
    (tmp_path / "run").mkdir()

    def run(*args: str, **env_over: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "DS4_RECIPES_DIR": str(tmp_path / "recipes"), "DS4_CACHE_DIR": str(tmp_path / "cache"),
               "DS4_COMPOSE_DIR": str(tmp_path / "out"), "PYTHONPATH": str(REPO), **env_over}
        return subprocess.run([sys.executable, "-m", "ds4deploy.cli", *args], capture_output=True, text=True,
                              env=env, cwd=tmp_path / "run", check=False, timeout=TIMEOUT_S)

    return run


def refused(p: subprocess.CompletedProcess, *needles: str) -> None:
    """One clean refusal: exit 2, `error:` and `fix:` lines, every needle in the message, no traceback."""
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr + p.stdout
    assert p.stderr.startswith("error: ") and "\nfix: " in p.stderr, p.stderr
    for needle in needles:
        assert needle in p.stderr, (needle, p.stderr)


# --- model lock --from ---------------------------------------------------------------------------------------------


def local_recipe(tmp_path: Path, name: str = "m04", **model: str) -> str:
    """The m04 case's local-model recipe as recipe `name` in the scratch recipes/, with `model` keys set."""
    data = yaml.safe_load(M04.read_text())
    data["name"] = name
    data["model"].update(model)
    (tmp_path / "recipes" / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return name


def test_links_to_files_are_followed_and_a_broken_link_is_refused(cli, tmp_path):
    """A Hugging Face cache snapshot is links into ../../blobs/: followed (the content is what is hashed). A link to
    nothing, or to something that is not a regular file, is refused (it was hashed and recorded before, or failed)."""
    name = local_recipe(tmp_path)
    snap, blobs = tmp_path / "hub" / "snapshots" / "rev", tmp_path / "hub" / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    (blobs / "abc").write_bytes(b"part of the model")
    (snap / "model.gguf").symlink_to("../../blobs/abc")
    assert cli("model", "lock", name, "--from", str(snap)).returncode == 0
    (tmp_path / "recipes" / f"{name}.manifest.json").unlink()
    (snap / "model.gguf").unlink()
    (snap / "model.gguf").symlink_to("../../blobs/missing")
    (snap / "pipe.bin").symlink_to("/dev/null")
    before = files_under(tmp_path)
    refused(cli("model", "lock", name, "--from", str(snap)), "model.gguf -> ", "a symbolic link to no regular file")
    # The broken link named as the file: there is no such file.
    refused(cli("model", "lock", name, "--from", str(snap / "model.gguf")), "does not exist on this host")
    assert files_under(tmp_path) == before, "a refused lock wrote something"


def test_the_file_the_engine_loads_must_be_in_the_manifest(cli, tmp_path):
    name = local_recipe(tmp_path, "m05", file="model.gguf")
    src = tmp_path / "src"
    src.mkdir()
    (src / "other.gguf").write_bytes(b"another model")
    before = files_under(tmp_path)
    for where in (src, src / "other.gguf"):
        p = cli("model", "lock", name, "--from", str(where))
        refused(p, "recipe 'm05' has the engine load model.file model.gguf", "holds no model.gguf (its files: "
                "other.gguf)", "set model.file")
        assert files_under(tmp_path) == before
    (src / "model.gguf").write_bytes(b"the model")
    assert cli("model", "lock", name, "--from", str(src)).returncode == 0


def test_split_parts_named_in_upper_case_are_found_and_refused(cli, tmp_path):
    name = local_recipe(tmp_path)
    parts = tmp_path / "parts"
    parts.mkdir()
    for n in (1, 3):  # part 2 of 3 missing, as in the m04 case
        (parts / f"M-{n:05d}-of-00003.GGUF").write_bytes(b"part %d" % n)
    before = files_under(tmp_path)
    p = cli("model", "lock", name, "--from", str(parts))
    refused(p, "split GGUF M: part(s) M-00001-of-00003.GGUF, M-00003-of-00003.GGUF are not named as gguf-split",
            "invalid split file name", "split GGUF M: part(s) 00002-of-00003 missing (2 of 3 present)", ".gguf")
    assert files_under(tmp_path) == before
    # Every part there, one in upper case: still not loadable (llama.cpp derives part 2's name in lower case).
    assert split_gguf_problems(["M-00001-of-00002.gguf", "M-00002-of-00002.GGUF"]) == [
        "split GGUF M: part(s) M-00002-of-00002.GGUF are not named as gguf-split names parts "
        "(<stem>-NNNNN-of-MMMMM.gguf, in lower case); the engine derives each part's name from part 1's in lower case "
        "and stops with 'invalid split file name'"]
    # A "split" of one part is loaded as one file, whatever its case.
    assert split_gguf_problems(["M-00001-of-00001.GGUF", "other.GGUF"]) == []


def test_a_directory_where_the_manifest_goes_is_refused_before_hashing(cli, tmp_path):
    name = local_recipe(tmp_path)
    (tmp_path / "recipes" / f"{name}.manifest.json").mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.bin").write_bytes(b"model")
    before = files_under(tmp_path)
    p = cli("model", "lock", name, "--from", str(tmp_path / "src"))
    refused(p, f"{name}.manifest.json is a directory, where the manifest of '{name}' is written", "move it out")
    assert files_under(tmp_path) == before


# --- image lock ----------------------------------------------------------------------------------------------------


@pytest.fixture
def sm86(tmp_path):
    """The sm86 reference recipe in the scratch recipes/, its wheel URL pointed at `base` by `set_url(base)`; a
    copy of the wheel at `tmp_path/www/<wheel>` (what the mirror serves and what a local --artifact names)."""
    path = tmp_path / "recipes" / f"{SM86}.yaml"
    shutil.copy(REPO / "recipes" / f"{SM86}.yaml", path)
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / WHEEL).write_bytes(b"PK\x03\x04 stands in for the wheel")

    def set_url(base: str) -> None:
        data = yaml.safe_load(path.read_text())
        data["engine"]["image"]["build_args"]["LVLLMDS4X_URL"] = base
        path.write_text(yaml.safe_dump(data, sort_keys=False))

    set_url("http://127.0.0.1:9/nowhere")  # port 9 (discard): nothing is downloaded from the recipe's URL here
    return set_url


@pytest.fixture
def mirror(tmp_path, sm86):
    """A real HTTP server on 127.0.0.1 (a free port) serving `tmp_path/www`; yields its base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "www"))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("tail", "secret", "named"), [
    (f"?token={TOKEN}", TOKEN, "query parameter 'token'"),
    ("?access_token=hunter2hunter2", "hunter2hunter2", "query parameter 'access_token'"),
    ("?v=1&X-Amz-Signature=0a1b2c3d4e5f", "0a1b2c3d4e5f", "query parameter 'X-Amz-Signature'"),
    ("#user:hunter2", "hunter2", "the fragment (a user:password pair or a token)"),
], ids=["token", "access_token", "signature", "fragment"])
def test_a_credential_in_an_artifact_url_is_refused_not_recorded(cli, tmp_path, mirror, tail, secret, named):
    before = files_under(tmp_path)
    p = cli("image", "lock", SM86, "--artifact", f"LVLLMDS4X={mirror}/{WHEEL}{tail}")
    refused(p, f"the URL from --artifact LVLLMDS4X=URL ({mirror}/{WHEEL}) carries a credential in {named}",
            "user part")
    assert secret not in p.stdout + p.stderr
    assert files_under(tmp_path) == before, "a refused lock wrote a lock or a cache copy"
    # A benign query and fragment are recorded as given (a pip-style #sha256= fragment).
    ok = cli("image", "lock", SM86, "--artifact", f"LVLLMDS4X={mirror}/{WHEEL}?v=1#sha256=00ff")
    assert ok.returncode == 0, ok.stderr
    assert f"{WHEEL}?v=1#sha256=00ff" in (tmp_path / "recipes" / f"{SM86}.lock.json").read_text()


def test_a_directory_where_the_lock_goes_is_refused_before_anything_is_copied(cli, tmp_path, sm86):
    (tmp_path / "recipes" / f"{SM86}.lock.json").mkdir()
    before = files_under(tmp_path)
    p = cli("image", "lock", SM86, "--artifact", f"LVLLMDS4X={tmp_path / 'www' / WHEEL}")
    refused(p, f"{SM86}.lock.json is a directory, where the lock of '{SM86}' is written", "move it out of the way")
    assert files_under(tmp_path) == before, "a temporary lock or a cache copy was left behind"


def test_a_cache_that_is_a_file_is_named_once(cli, tmp_path, sm86):
    (tmp_path / "cachefile").write_text("not a directory\n")
    before = files_under(tmp_path)
    for cache in (tmp_path / "cachefile", tmp_path / "cachefile" / "below"):
        p = cli("image", "lock", SM86, "--artifact", f"LVLLMDS4X={tmp_path / 'www' / WHEEL}",
                DS4_CACHE_DIR=str(cache))
        refused(p, f"DS4_CACHE_DIR={cache} cannot hold the artifact copies: {tmp_path / 'cachefile'} is a file",
                "point DS4_CACHE_DIR at a directory")
        assert files_under(tmp_path) == before


@pytest.mark.parametrize("base", ["ftp://mirror.example/wheels", "file:///srv/wheels"])
def test_a_recipe_url_builds_cannot_download_is_named_as_the_cause(cli, tmp_path, sm86, base):
    sm86(base)
    before = files_under(tmp_path)
    p = cli("image", "lock", SM86, "--artifact", f"LVLLMDS4X={tmp_path / 'www' / WHEEL}")
    refused(p, f"engine.image.build_args.LVLLMDS4X_URL of recipe '{SM86}' is '{base}'", "plain http(s) URL",
            "set LVLLMDS4X_URL in engine.image.build_args")
    assert "pass the artifact from a plain http(s) URL or a local file" not in p.stderr  # which the user did
    assert files_under(tmp_path) == before
