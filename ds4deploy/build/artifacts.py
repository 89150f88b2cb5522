"""Image artifacts: files an engine image build downloads (a wheel from a release page, a pinned tarball), locked by
sha256 once and verified on every build.

Which artifacts a build downloads is read from the image's own Dockerfile, merged with the recipe's
``engine.image.build_args`` (the recipe overrides a default, as ``docker build --build-arg`` does): every
``ARG <NAME>_SHA256`` declares artifact ``<NAME>``, whose file name is ``<NAME>_WHEEL`` (or ``<NAME>_FILE``) and
whose default download URL is ``<NAME>_URL/<file>``. images/sm86/Dockerfile declares ``LVLLMDS4X`` (the Lvllmds4-x
wheel) this way, and checks the wheel against ``LVLLMDS4X_SHA256`` with ``sha256sum -c`` before installing it.

`ds4deploy image lock <recipe>` (`lock_image`) takes each artifact from its default URL or from what the user passes
(``--artifact NAME=URL|PATH``: a mirror, or a file copied by hand from a machine that can reach the release page),
hashes it, keeps a copy in the cache (``<cache>/artifacts/<sha256>/<file>``, `ds4deploy.model.verify.cache_dir`) and
writes ``recipes/<name>.lock.json`` beside the recipe, which the user commits::

    {"recipe": "rtx3090x2-xeon-ds4-flash", "image": "sm86",
     "artifacts": {"LVLLMDS4X": {"file": "lvllmds4_x-2.3.8-...whl", "url": "https://...", "size": 123,
                                 "sha256": "..."}}}

An owner-supplied base image (`owner_base_image`: an ``engine.image.base_image`` under ``local/``, an image no
registry serves, which the owner loads with ``docker load`` or pulls and tags on the node) is locked the same way:
`lock_image` reads its image ID on this host (``docker image inspect``: the sha256 of the image's config, which
``docker save``/``docker load`` and registries keep, docs/sources.md#docker-image-id) and records it as
``"base_image": {"ref": "<the tag>", "id": "sha256:...", "repo_digests": [...]}``; every build refuses a lock
without it and a host whose image under that tag has another ID (`locked_base_image`, `check_base_image`, and the
same comparison on each node in ansible/roles/preflight and ansible/roles/image).

Builds (`locked_files`, `locked_build_args`, used by `ds4deploy.build.image`) require the lock, place each artifact in
the build context's ``wheelhouse/`` only after its sha256 matched the lock (from the cache, a wheel directory, or a
fresh download from the locked URL), and pass the locked sha256 as the ``<NAME>_SHA256`` build argument, so the
Dockerfile verifies the same digest again. A lock that disagrees with the artifact stops the build, naming both
digests; no lock stops it with the command that creates one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated
from urllib.parse import unquote_plus, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ds4deploy.core.errors import UserError
from ds4deploy.core.secret_scan import is_secret_name, strip_userinfo, token_shape
from ds4deploy.core.yamlio import load_json
from ds4deploy.recipe import paths as recipe_paths
from ds4deploy.recipe.paths import REPO_ROOT
from ds4deploy.recipe.schema import Recipe

IMAGES_DIR = REPO_ROOT / "images"
# Seconds without a byte before a download is given up (httpx read timeout); connecting gets the same.
DOWNLOAD_TIMEOUT_S = 60
CHUNK = 1 << 20  # bytes per read while downloading and hashing


@dataclass(frozen=True)
class Artifact:
    """One downloaded file of an image build.

    Attributes:
        name: the build-arg prefix, e.g. ``LVLLMDS4X``.
        file: the file name the build expects in its context's ``wheelhouse/``.
        url: where it is downloaded from by default (``<NAME>_URL/<file>``).
    """

    name: str
    file: str
    url: str

    @property
    def sha_arg(self) -> str:
        """The build argument that carries its sha256, e.g. ``LVLLMDS4X_SHA256``."""
        return f"{self.name}_SHA256"


# An artifact's file name: one path component, so ``<cache>/artifacts/<sha256>/<file>`` and the build context's
# ``wheelhouse/<file>`` stay inside their directories (no '/', no '..', no leading '.'); wheel and sdist names use
# only these characters (PEP 427 file name convention, https://peps.python.org/pep-0427/#file-name-convention).
FILE_RE = r"^[A-Za-z0-9][A-Za-z0-9._+-]*$"
SHA256_RE = r"^[0-9a-f]{64}$"


# What a lock entry's URL must look like: http(s), no userinfo left, no white space (`LockEntry.url`).
URL_RE = r"^https?://[^@\s]+$"


class LockEntry(BaseModel):
    """One artifact in ``recipes/<name>.lock.json``: its file name, the URL it was fetched from (no userinfo),
    size in bytes, sha256 (64 lower-case hex)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    file: str = Field(pattern=FILE_RE)
    url: str = Field(pattern=URL_RE)
    size: int = Field(ge=0)
    sha256: str = Field(pattern=SHA256_RE)


# An image ID as `docker image inspect --format '{{.Id}}'` prints it: the sha256 of the image config
# (docs/sources.md#docker-image-id).
IMAGE_ID_RE = r"^sha256:[0-9a-f]{64}$"
# A repository digest as Docker lists it in RepoDigests (``name@sha256:<64 hex>``), and an image reference (the
# tag it was read from): no white space, bounded like Docker's own references (255 characters for the name,
# https://github.com/distribution/reference, reference.go NameTotalLengthMax, plus a tag of at most 128).
REPO_DIGEST_RE = r"^[a-z0-9][a-z0-9._/:-]{0,254}@sha256:[0-9a-f]{64}$"
IMAGE_REF_RE = r"^[a-z0-9][a-z0-9._/:-]{0,254}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$"
# The prefix that marks an owner-supplied base image (`owner_base_image`).
OWNER_BASE_PREFIX = "local/"
# Seconds for one `docker image inspect` (a local daemon answers in well under a second).
DOCKER_INSPECT_TIMEOUT_S = 30


class BaseImageLock(BaseModel):
    """The owner-supplied base image in ``recipes/<name>.lock.json``: the tag it was read from (`ref`), its image ID
    (`id`, ``sha256:`` + 64 lower-case hex) and its RepoDigests where the image came from a registry (at most 16)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    ref: str = Field(pattern=IMAGE_REF_RE)
    id: str = Field(pattern=IMAGE_ID_RE)
    repo_digests: list[Annotated[str, Field(pattern=REPO_DIGEST_RE)]] = Field(default_factory=list, max_length=16)


class ImageLock(BaseModel):
    """``recipes/<name>.lock.json``: which recipe and image it locks, each artifact's `LockEntry` by name and, for an
    owner-supplied base image, its `BaseImageLock`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    recipe: str
    image: str
    artifacts: dict[str, LockEntry]
    base_image: BaseImageLock | None = None


_ARG = re.compile(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?$")


def dockerfile_args(path: Path) -> dict[str, str]:
    """Every ``ARG NAME[=default]`` of a Dockerfile, ``{NAME: default}`` (empty string without a default; quotes
    around a default removed). The first declaration of a name wins, as a build arg is declared once per stage."""
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = _ARG.match(line)
        if m:
            out.setdefault(m.group(1), (m.group(2) or "").strip().strip("\"'"))
    return out


def image_artifacts(recipe: Recipe) -> list[Artifact]:
    """The artifacts the recipe's image build downloads (module docstring), sorted by name.

    Raises:
        UserError: the Dockerfile declares ``<NAME>_SHA256`` without the file name or URL arguments that go with it.
    """
    dockerfile = IMAGES_DIR / recipe.engine.image.arch / "Dockerfile"
    if not dockerfile.is_file():
        return []
    args = {**dockerfile_args(dockerfile), **recipe.image_build_args}
    out = []
    for key in sorted(k for k in args if k.endswith("_SHA256")):
        name = key.removesuffix("_SHA256")
        file = args.get(f"{name}_WHEEL") or args.get(f"{name}_FILE")
        base = args.get(f"{name}_URL")
        if not file or not base:
            raise UserError(f"{dockerfile.relative_to(REPO_ROOT)} declares {key} but not {name}_WHEEL (or {name}_FILE) "
                            f"and {name}_URL, so the artifact it checks has no file name or download URL",
                            f"declare ARG {name}_WHEEL and ARG {name}_URL (or set them in engine.image.build_args)")
        if not re.match(FILE_RE, file):
            raise UserError(f"{name}_WHEEL (or {name}_FILE) is {file!r}: an artifact file name must be one plain file "
                            "name (no '/', no '..'), since it is written under the cache and the build context",
                            f"set {name}_WHEEL to the file's own name, e.g. lvllmds4_x-2.3.8-cp312-...whl")
        out.append(Artifact(name, file, f"{base.rstrip('/')}/{file}"))
    return out


def lock_path(recipe: Recipe) -> Path:
    """Where the recipe's artifact lock lives: ``recipes/<name>.lock.json``."""
    return recipe_paths.RECIPES_DIR / f"{recipe.base_name}.lock.json"


def cached_path(sha256: str, file: str) -> Path:
    """The cache's copy of an artifact: ``<cache>/artifacts/<sha256>/<file>`` (content-addressed: one digest, one
    file)."""
    from ds4deploy.model.verify import cache_dir

    return cache_dir() / "artifacts" / sha256 / file


def load_lock(recipe: Recipe) -> dict | None:
    """The committed lock, or None when there is none. Read through the bounded reader (`ds4deploy.core.yamlio`) and
    checked against `ImageLock`, and against the recipe: a lock that names another recipe or image (copied or edited
    by hand) locks nothing of this one.

    Raises:
        UserError: the lock is not valid JSON, does not match the schema (the field named), or names another
            recipe or image.
    """
    path = lock_path(recipe)
    if not path.is_file():
        return None
    fix = f"delete {path} and run `ds4deploy image lock {recipe.base_name}`, then commit it"
    data = load_json(path, fix)
    try:
        ImageLock.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        got = err.get("input")
        if len(err["loc"]) == 2 and err["loc"][0] == "artifacts" and not isinstance(got, dict):
            problem = f"{where} is {type(got).__name__} {got!r}, not a mapping {{file, url, size, sha256}}"
        elif err["type"] == "missing":
            problem = f"{where} is missing"
        elif isinstance(got, dict | list):
            problem = f"{where}: {err['msg']}"
        else:
            problem = f"{where} = {got!r}: {err['msg']}"
        raise UserError(f"{path}: {problem} ({len(exc.errors())} problem(s) in the lock)", fix) from None
    for key, want in (("recipe", recipe.base_name), ("image", recipe.engine.image.arch)):
        if data[key] != want:
            raise UserError(f"{path} locks {key} {data[key]!r}, but recipe '{recipe.base_name}' is {key} {want!r}: "
                            "a lock copied from another recipe (or edited) locks nothing of this one", fix)
    return data


def _sha256(path: Path) -> str:
    from ds4deploy.model.verify import hash_path

    return hash_path(path, "sha256")


def _http_reason(exc: Exception) -> str:
    """Why an httpx request failed, for a message: ``HTTP <status>`` or the transport error's text."""
    import httpx

    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    return str(exc) or type(exc).__name__


def _download(url: str, into: Path, name: str) -> str:
    """Download `url` to `into` (via a temporary file in the same directory), hashing while it streams; `name` is
    the artifact's name, for the fix.

    Returns:
        The hex sha256 of the bytes written.
    Raises:
        UserError: the URL cannot be reached, answers with an error status, or the file cannot be written.
    """
    import httpx

    h = hashlib.sha256()
    tmp = None
    try:
        into.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".download-", dir=into.parent)
        with os.fdopen(fd, "wb") as out, httpx.stream("GET", url, follow_redirects=True,
                                                     timeout=DOWNLOAD_TIMEOUT_S) as resp:
            resp.raise_for_status()
            for chunk in resp.iter_bytes(CHUNK):
                h.update(chunk)
                out.write(chunk)
        os.replace(tmp, into)
    except httpx.HTTPError as exc:
        reason = _http_reason(exc)
        raise UserError(f"could not download {strip_userinfo(url)}: {strip_userinfo(reason)}",
                        f"download it where the URL is reachable and pass the file with --artifact {name}=PATH (or a "
                        f"reachable mirror with --artifact {name}=URL; https_proxy is honoured)") from None
    except OSError as exc:
        raise UserError(f"could not write {into}: {exc.strerror or exc}", f"make {into.parent} writable") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return h.hexdigest()


def _is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def _obtain(art: Artifact, source: str) -> tuple[str, int]:
    """Hash the artifact from `source` (URL or local file) and keep a copy in the cache. Returns (sha256, size)."""
    if _is_url(source):
        tmp = cached_path("incoming", art.file)
        sha = _download(source, tmp, art.name)
    else:
        src = Path(source)
        if not src.is_file():
            raise UserError(f"{art.name}: {src} is not a file on this host",
                            f"pass the downloaded {art.file} (--artifact {art.name}=PATH) or its URL")
        sha = _sha256(src)
        tmp = cached_path("incoming", art.file)
        _cache_step(lambda: shutil.copyfile(src, tmp), tmp, tmp, f"could not copy {src} into the cache ({tmp})")
        if _sha256(tmp) != sha:
            tmp.unlink(missing_ok=True)
            raise UserError(f"{src} changed while it was copied into the cache", "run the lock again")
    final = cached_path(sha, art.file)
    _cache_step(lambda: os.replace(tmp, final), tmp, final, f"could not write {final}")
    return sha, final.stat().st_size


def _cache_step(write: Callable[[], object], tmp: Path, dest: Path, what: str) -> None:
    """One write into the artifact cache (`dest`'s folder made first); on an OS error the partial `tmp` is removed
    and one message names `what` and the folder to fix.

    Raises:
        UserError: the folder cannot be made or written (full, read-only, a file where a folder goes).
    """
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        write()
    except OSError as exc:
        if tmp.is_file():
            tmp.unlink()
        raise UserError(f"{what}: {exc.strerror or exc}",
                        f"make {dest.parent} writable (or point DS4_CACHE_DIR at a writable directory)") from None


# Query parameter names that carry a signature, a credential until it expires, with no credential word in them
# (`is_secret_name` finds X-Amz-Credential, token, access_token): AWS SigV4 presigned URLs' X-Amz-Signature
# (https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-query-string-auth.html), Google Cloud Storage signed URLs'
# X-Goog-Signature (https://cloud.google.com/storage/docs/access-control/signed-urls), Azure shared access
# signatures' sig (https://learn.microsoft.com/en-us/rest/api/storageservices/create-service-sas).
_SIGNATURE_NAME = re.compile(r"(^|[-_])(sig|signature)$", re.IGNORECASE)


def url_credentials(url: str) -> list[str]:
    """Where the query or the fragment of `url` carries a credential, one phrase each, naming the parameter but
    never its value: a parameter whose name is credential-shaped (`is_secret_name`: ``token``, ``access_token``;
    a signature, `_SIGNATURE_NAME`) or whose value has a credential's shape (`token_shape`: ``ghp_...``), and a
    piece without ``=`` that is a token or a ``user:password`` pair (RFC 3986 section 3.2.1's deprecated form).
    Empty when there is none."""
    parts = urlsplit(url)
    out = []
    for where, text in (("query", parts.query), ("fragment", parts.fragment)):
        for piece in re.split(r"[&;]", text):
            raw_name, sep, raw_value = piece.partition("=")
            name, value = unquote_plus(raw_name), unquote_plus(raw_value)
            if sep and token_shape(name):
                out.append(f"a {where} parameter whose name is a credential")
            elif sep and (is_secret_name(name) or _SIGNATURE_NAME.search(name) or token_shape(value)):
                out.append(f"{where} parameter {name!r}")
            elif not sep and name and (":" in name or token_shape(name)):
                out.append(f"the {where} (a user:password pair or a token)")
    return list(dict.fromkeys(out))


def _bare(url: str) -> str:
    """`url` without userinfo, query and fragment: what a message may print of a URL that carries a credential."""
    parts = urlsplit(strip_userinfo(url))
    return urlunsplit(parts._replace(query="", fragment=""))


def _url_origin(recipe: Recipe, art: Artifact) -> str:
    """Where an artifact's default URL (``<NAME>_URL/<file>``) comes from: the recipe's build arg or the
    Dockerfile's ARG default."""
    arg = f"{art.name}_URL"
    if arg in recipe.image_build_args:
        return f"engine.image.build_args.{arg} of recipe '{recipe.base_name}'"
    return f"ARG {arg} of images/{recipe.engine.image.arch}/Dockerfile"


def check_recorded_url(recipe: Recipe, art: Artifact, source: str, given: bool) -> None:
    """Refuse, before anything is downloaded, copied or written, an artifact whose URL cannot go into the committed
    lock: the URL the lock records (the --artifact URL, or for a local file the recipe's ``<NAME>_URL/<file>``,
    where builds download it when no copy is at hand) must be plain http(s) (`URL_RE`) and carry no credential in its
    query or fragment (`url_credentials`; userinfo is used for the download and stripped, `strip_userinfo`). The
    message names what the user wrote: the --artifact option, or the recipe's (or Dockerfile's) build arg.

    Args:
        source: the --artifact value, or the default URL when none was given.
        given: whether `source` came from --artifact.
    Raises:
        UserError: naming the URL's origin and the credential-carrying parameter (never its value).
    """
    url_given = given and _is_url(source)
    recorded = strip_userinfo(source if url_given else art.url)
    origin = f"--artifact {art.name}=URL" if url_given else _url_origin(recipe, art)
    arg = f"{art.name}_URL"
    lock = lock_path(recipe).name
    creds = url_credentials(recorded)
    if creds:
        if url_given:
            fix = (f"give the mirror the credential in the URL's user part (http(s)://user:TOKEN@host/..., used "
                   f"for the download and never recorded), or download {art.file} yourself and pass it with "
                   f"--artifact {art.name}=PATH")
        else:
            fix = (f"remove the credential from {arg} ({origin}); a recipe and a lock are committed, so a credential "
                   f"goes in the URL's user part of an --artifact {art.name}=URL, or download {art.file} yourself and "
                   f"pass it with --artifact {art.name}=PATH")
        raise UserError(f"{art.name}: the URL from {origin} ({_bare(recorded)}) carries a credential in "
                        f"{', '.join(creds)}; {lock} would record it; nothing was downloaded or written", fix)
    if not re.fullmatch(URL_RE, recorded):
        if url_given:
            raise UserError(f"{art.name}: the URL from {origin} ({_bare(recorded)!r}) has white space or '@' after the "
                            f"host, which {lock} cannot record; nothing was downloaded or written",
                            "pass the artifact from a plain http(s) URL or a local file")
        raise UserError(f"{art.name}: {origin} is {_bare(recorded.rsplit('/', 1)[0])!r}: {lock} records "
                        f"<{arg}>/<file> as the URL builds download the artifact from when no copy is at hand, and "
                        "builds download only from a plain http(s) URL (no white space, no '@'); nothing was written",
                        f"set {arg} in engine.image.build_args of recipe '{recipe.base_name}' to the http(s) folder "
                        "the artifact is published in (or remove it there to use the Dockerfile's default), then "
                        "lock again")


def check_cache() -> None:
    """Refuse before anything is copied when the cache (`ds4deploy.model.verify.cache_dir`) cannot hold a directory:
    it, or a folder above it, is a file.

    Raises:
        UserError: naming the file in the way, and DS4_CACHE_DIR when it is set.
    """
    from ds4deploy.model.verify import cache_dir

    root = cache_dir()
    p = root / "artifacts"
    while not p.exists() and p != p.parent:  # the nearest part of the path that exists must be a directory
        p = p.parent
    if not p.is_dir():
        named = f"DS4_CACHE_DIR={root}" if os.environ.get("DS4_CACHE_DIR") else f"the cache {root}"
        raise UserError(f"{named} cannot hold the artifact copies: {p} is a file, not a directory; nothing was "
                        "written", f"point DS4_CACHE_DIR at a directory (or unset it: "
                        f"$XDG_CACHE_HOME/ds4deploy, else ~/.cache/ds4deploy), or move {p} out of the way")


def parse_sources(values: list[str], arts: list[Artifact]) -> dict[str, str]:
    """``NAME=URL|PATH`` options as ``{NAME: source}``.

    Raises:
        UserError: a value without ``=``, or a name the image build does not download.
    """
    known = {a.name for a in arts}
    out = {}
    for v in values:
        name, sep, source = v.partition("=")
        if not sep or not source:
            raise UserError(f"--artifact {v!r} is not NAME=URL or NAME=PATH", "e.g. --artifact LVLLMDS4X=./x.whl")
        if name not in known:
            raise UserError(f"--artifact names {name}, which this image build does not download",
                            f"use one of: {', '.join(sorted(known)) or '(none)'}")
        out[name] = source
    return out


def owner_base_image(recipe: Recipe) -> str | None:
    """The recipe's base image when its owner supplies it, else None.

    Owner-supplied means ``engine.image.base_image`` lies under ``local/`` (`OWNER_BASE_PREFIX`): the recipe schema's
    rule for an image no registry serves (the owner's own build, loaded with ``docker load`` or pulled and tagged on
    the node; ``engine.image.base_image`` in ds4deploy.recipe.schema). Public bases (Debian, CUDA, the debootstrap
    stand-in) are pinned by their tags and build arguments instead.
    """
    base = recipe.engine.image.base_image
    return base if base.startswith(OWNER_BASE_PREFIX) else None


def inspect_image(ref: str) -> dict | None:
    """What the local Docker daemon knows of image `ref`: ``{"id": "sha256:<64 hex>", "repo_digests": [...]}``, or
    None when the daemon has no image under that reference.

    ``Id`` is the sha256 of the image config (docs/sources.md#docker-image-id); ``RepoDigests`` is empty for an image
    that was only loaded or built here.

    Raises:
        UserError: the docker CLI is missing, the daemon cannot be reached, or it answers with something that is not
            an image ID.
    """
    try:
        proc = subprocess.run(["docker", "image", "inspect", "--format", "{{json .Id}} {{json .RepoDigests}}", ref],
                              capture_output=True, text=True, check=False, timeout=DOCKER_INSPECT_TIMEOUT_S)
    except FileNotFoundError:
        raise UserError(f"the image ID of {ref} cannot be read: the docker CLI is not installed on this host",
                        "run this on the host that holds the image (where Docker runs)") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"docker image inspect {ref} did not answer in {DOCKER_INSPECT_TIMEOUT_S} s",
                        "check that the Docker daemon is running (systemctl status docker)") from None
    if proc.returncode != 0:
        err = proc.stderr.strip()
        if "invalid reference format" in err.lower():
            raise UserError(f"{ref} is not an image name Docker accepts: {err[:300]}",
                            "set engine.image.base_image to a lower-case repository with an optional :tag, e.g. "
                            "local/my-engine:v1")
        if "no such image" in err.lower() or "no such object" in err.lower():
            return None
        raise UserError(f"docker image inspect {ref} failed: {err[:300]}",
                        "check that the Docker daemon is running and that you may use it (docker group)")
    try:
        image_id, digests = (json.loads(part) for part in proc.stdout.strip().split(" ", 1))
    except ValueError:
        image_id, digests = None, None
    if not isinstance(image_id, str) or not re.fullmatch(IMAGE_ID_RE, image_id):
        raise UserError(f"docker image inspect {ref} printed {proc.stdout.strip()[:200]!r}, not an image ID",
                        "check the docker CLI on this host")
    return {"id": image_id, "repo_digests": sorted(d for d in (digests or []) if re.fullmatch(REPO_DIGEST_RE, d))}


def _supply_fix(recipe: Recipe, ref: str) -> str:
    return (f"load the image of your engine (`docker load -i <file>`, or `docker pull <name>`) and tag it "
            f"(`docker tag <loaded image> {ref}`), then run `ds4deploy image lock {recipe.base_name}` again")


def locked_base_image(recipe: Recipe) -> dict | None:
    """The lock's record of the recipe's owner-supplied base image (`owner_base_image`), checked against the recipe;
    None when the base is not owner-supplied. Reads only the lock (no Docker), so the control host can run it.

    Raises:
        UserError: no lock, or a lock without ``base_image`` (the fix names ``ds4deploy image lock <recipe>``); a lock
            whose ``base_image.ref`` is another tag than the recipe's base image; a malformed lock (`load_lock`).
    """
    ref = owner_base_image(recipe)
    if ref is None:
        return None
    path = lock_path(recipe)
    lock = load_lock(recipe)
    entry = (lock or {}).get("base_image")
    fix = (f"on the host that holds {ref}, run `ds4deploy image lock {recipe.base_name}` and commit {path.name} "
           f"(no image there yet: {_supply_fix(recipe, ref)})")
    if entry is None:
        where = f"{path} is missing" if lock is None else f"{path} records no base_image"
        raise UserError(f"{where}: recipe '{recipe.base_name}' builds on {ref}, an image its owner supplies, and no "
                        "image ID pins it, so another image under the same tag would be built on silently", fix)
    if entry["ref"] != ref:
        raise UserError(f"{path.name} locks base image {entry['ref']}, but recipe '{recipe.base_name}' builds on {ref}",
                        f"delete the base_image entry of {path.name}, then {fix}")
    return entry


def pinned_base_id(recipe: Recipe) -> str | None:
    """The locked image ID of the recipe's owner-supplied base image, or None: a public base, or one not pinned yet
    (no lock, no ``base_image`` entry, another tag, a malformed lock: `locked_base_image` says which, and the deploy's
    `check_run` and the build refuse it). For what only reports or passes the ID on."""
    try:
        entry = locked_base_image(recipe)
    except UserError:
        return None
    return entry["id"] if entry is not None else None

def check_base_image(recipe: Recipe, inspected: dict | None = None) -> str | None:
    """Refuse a build whose owner-supplied base image is not the locked one: the lock records its ID
    (`locked_base_image`) and this host's image under that tag has the same ID. None when the base is not
    owner-supplied.

    Args:
        inspected: this host's `inspect_image` answer for the base (default: read here).
    Returns:
        The locked image ID (``sha256:...``), or None.
    Raises:
        UserError: see `locked_base_image`; the image is absent on this host (the fix names ``docker load``); code 1
            when its ID differs from the lock (both IDs named).
    """
    entry = locked_base_image(recipe)
    if entry is None:
        return None
    ref = entry["ref"]
    got = inspected if inspected is not None else inspect_image(ref)
    if got is None:
        raise UserError(f"this host has no image {ref} (the base image of '{recipe.base_name}', locked as "
                        f"{entry['id']})", f"load the image of your engine (`docker load -i <file>` or "
                        f"`docker pull <name>`), tag it {ref}, and run the build again")
    if got["id"] != entry["id"]:
        raise UserError(f"{ref} on this host is image {got['id']}, but {lock_path(recipe).name} locks {entry['id']}; "
                        "nothing was built", f"load the image the lock records under {ref} (`docker load -i <file>`, "
                        f"then `docker tag`), or, if your engine changed on purpose, delete the base_image entry of "
                        f"{lock_path(recipe).name}, run `ds4deploy image lock {recipe.base_name}` and commit it",
                        code=1)
    return entry["id"]


def lock_image(recipe: Recipe, sources: dict[str, str]) -> tuple[dict, Path, bool]:
    """Resolve every artifact of the recipe's image build, hash it, read the image ID of an owner-supplied base image
    on this host, and record the lock (module docstring).

    Args:
        sources: ``{NAME: URL or local path}`` overriding an artifact's default URL.
    Returns:
        ``(lock, path, written)``; `written` is False when the committed lock already recorded the same digests.
    Raises:
        UserError: the image has nothing to lock; something other than a file where the lock goes; a URL the lock
            cannot record (`check_recorded_url`: a credential in it, not plain http(s)); a cache that is a file
            (`check_cache`); the owner-supplied base image is not on this host (the image and ``docker load`` named,
            nothing written); a source that cannot be read or reached; code 1 when a committed lock disagrees with
            an artifact or with the base image's ID (both named; the lock is left as it is).
    """
    arts = image_artifacts(recipe)
    path = lock_path(recipe)
    base_ref = owner_base_image(recipe)
    if not arts and base_ref is None:
        raise UserError(f"the {recipe.engine.image.arch} image build of '{recipe.name}' downloads no artifact that "
                        "needs a lock (no ARG <NAME>_SHA256 in its Dockerfile) and builds on no owner-supplied base "
                        f"image (engine.image.base_image under {OWNER_BASE_PREFIX})", "nothing to lock")
    from ds4deploy.model.lock import occupied_by

    what = occupied_by(path)
    if what is not None:  # before anything is downloaded or copied
        raise UserError(f"{path} is {what}, where the lock of '{recipe.base_name}' is written; nothing was written",
                        f"move it out of the way (it is no lock), then run `ds4deploy image lock {recipe.base_name}` "
                        "again")
    committed = load_lock(recipe)
    for art in arts:
        check_recorded_url(recipe, art, sources.get(art.name, art.url), art.name in sources)
    if arts:
        check_cache()
    base = None
    if base_ref is not None:  # read first: an absent image stops before anything is downloaded or written
        got = inspect_image(base_ref)
        if got is None:
            raise UserError(f"this host has no image {base_ref}, the base image recipe '{recipe.base_name}' builds on "
                            "(its owner supplies it); nothing was written", _supply_fix(recipe, base_ref))
        base = {"ref": base_ref, "id": got["id"], "repo_digests": got["repo_digests"]}
        old = (committed or {}).get("base_image")
        if old is not None and (old["ref"], old["id"]) != (base_ref, got["id"]):
            raise UserError(f"{path} disagrees with this host's base image; the committed lock wins and was left as it "
                            f"is: {base_ref} here is image {got['id']}, {path.name} locks {old['ref']} as {old['id']}",
                            f"load the image the lock records, or, if your engine changed on purpose, delete the "
                            f"base_image entry of {path.name}, lock again and review the diff before committing",
                            code=1)
    entries = {}
    for art in arts:
        source = sources.get(art.name, art.url)
        sha, size = _obtain(art, source)
        # The lock is committed: a mirror's credentials (https://user:password@mirror/...) are used for the
        # download and never recorded.
        entries[art.name] = {"file": art.file, "url": strip_userinfo(source if _is_url(source) else art.url),
                             "size": size, "sha256": sha}
    lock: dict = {"recipe": recipe.base_name, "image": recipe.engine.image.arch, "artifacts": entries}
    if base is not None:
        lock["base_image"] = base
    if committed is not None:
        diff = [f"{n}: {e['file']} has sha256 {e['sha256']}, {path.name} says "
                f"{committed['artifacts'].get(n, {}).get('sha256')} ({committed['artifacts'].get(n, {}).get('file')})"
                for n, e in entries.items()
                if (committed["artifacts"].get(n) or {}).get("sha256") != e["sha256"]
                or committed["artifacts"][n].get("file") != e["file"]]
        if diff:
            raise UserError(f"{path} disagrees with the artifact; the committed lock wins and was left as it is:\n  "
                            + "\n  ".join(diff),
                            f"if the artifact changed on purpose (a new release), delete {path.name}, lock again and "
                            "review the diff before committing; otherwise pass the artifact the lock records", code=1)
        if committed.get("base_image") == lock.get("base_image"):
            return committed, path, False
    try:
        ImageLock.model_validate(lock)  # what is written is what load_lock accepts
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        if where.startswith("base_image"):
            raise UserError(f"engine.image.base_image {base_ref!r} of '{recipe.base_name}' cannot be locked "
                            f"({where}: {err['msg']}); nothing was written",
                            "name the image as Docker does (lower-case repository, optional :tag), e.g. "
                            "local/my-engine:v1") from None
        raise UserError(f"the lock of '{recipe.base_name}' would not be valid ({where}: {err['msg']}); nothing was "
                        "written", "pass the artifact from a plain http(s) URL or a local file") from None
    from ds4deploy.model.lock import write_atomic

    try:
        write_atomic(path, json.dumps(lock, indent=2) + "\n")
    except OSError as exc:
        raise UserError(f"could not write {path}: {exc.strerror or exc}; nothing was written",
                        f"make {path.parent} writable and run `ds4deploy image lock {recipe.base_name}` "
                        "again") from None
    return lock, path, True


def _locked_entries(recipe: Recipe) -> list[tuple[Artifact, dict]]:
    """Each artifact with its lock entry, checked for presence and agreement with the recipe.

    Raises:
        UserError: no lock; an artifact missing from the lock or locked under another file name; a recipe
            ``<NAME>_SHA256`` build argument that differs from the lock.
    """
    arts = image_artifacts(recipe)
    if not arts:
        return []
    path = lock_path(recipe)
    lock = load_lock(recipe)
    names = ", ".join(f"{a.name} ({a.file})" for a in arts)
    fix = (f"run `ds4deploy image lock {recipe.base_name}` (add --artifact {arts[0].name}=PATH|URL when "
           f"{arts[0].url} is unreachable from here) and commit {path.name}")
    if lock is None:
        raise UserError(f"{path} is missing: the {recipe.engine.image.arch} image build downloads {names} and has no "
                        "sha256 to check it against", fix)
    out = []
    for art in arts:
        entry = lock["artifacts"].get(art.name)
        if not isinstance(entry, dict) or entry.get("file") != art.file or not re.fullmatch(r"[0-9a-f]{64}",
                                                                                               str(entry.get("sha256"))):
            raise UserError(f"{path.name} does not lock {art.name} as {art.file} (it records "
                            f"{(entry or {}).get('file')!r})", f"delete {path.name}, then {fix}")
        pinned = recipe.engine.image.build_args.get(art.sha_arg)
        if pinned and pinned != entry["sha256"]:
            raise UserError(f"recipe '{recipe.name}' sets {art.sha_arg}={pinned} but {path.name} locks "
                            f"{entry['sha256']}", f"remove {art.sha_arg} from engine.image.build_args (the lock "
                            "carries it), or lock the artifact the recipe names")
        out.append((art, entry))
    return out


def locked_build_args(recipe: Recipe) -> dict[str, str]:
    """``{<NAME>_SHA256: locked sha256}`` for every artifact of the recipe's image build (no hashing, no network).

    Raises:
        UserError: see `_locked_entries`.
    """
    return {art.sha_arg: entry["sha256"] for art, entry in _locked_entries(recipe)}


def check_obtainable(recipe: Recipe, wheel_dirs: list[Path]) -> None:
    """The control-host check a deploy runs before any node is changed: every locked artifact is at hand (in the
    cache or a wheel directory, as `locked_files` looks for it) or its locked URL answers. Nothing is downloaded or
    hashed here; the build context hashes every file against the lock (`locked_files`).

    Args:
        recipe: the recipe.
        wheel_dirs: wheel directories the build context searches (`ds4deploy.build.image.default_wheel_dirs`).

    Raises:
        UserError: no or inconsistent lock (`_locked_entries`); an artifact with no local copy whose URL cannot be
            reached or answers with an error status (the URL and the reason named).
    """
    import httpx

    for art, entry in _locked_entries(recipe):
        local = [cached_path(entry["sha256"], art.file)] + [d / art.file for d in wheel_dirs]
        if any(p.is_file() for p in local):
            continue
        try:
            # GET, not HEAD (some release hosts refuse HEAD); only the status line is read.
            with httpx.stream("GET", entry["url"], follow_redirects=True, timeout=DOWNLOAD_TIMEOUT_S) as resp:
                resp.raise_for_status()
        except httpx.HTTPError as exc:
            reason = _http_reason(exc)
            raise UserError(f"{art.name}: {entry['url']} (locked in {lock_path(recipe).name}) cannot be fetched: "
                            f"{reason}; the image build needs it and no copy is in the cache or a wheel directory",
                            f"copy {art.file} to this host and put it in the cache with `ds4deploy image lock "
                            f"{recipe.base_name} --artifact {art.name}=PATH` (the lock then stays as it is when the "
                            "file matches), or make the URL reachable (https_proxy is honoured)") from None


def locked_files(recipe: Recipe, wheel_dirs: list[Path]) -> dict[str, Path]:
    """Every artifact of the recipe's image build as a local file whose sha256 matches the lock: from the cache,
    else a wheel directory, else downloaded from the locked URL into the cache.

    Returns:
        ``{file name in the build context: local path}``.
    Raises:
        UserError: no or inconsistent lock (`_locked_entries`); code 1 when a local copy or the download differs
            from the lock (path and both digests named, nothing placed); no local copy and the URL unreachable.
    """
    out = {}
    for art, entry in _locked_entries(recipe):
        want = entry["sha256"]
        cached = cached_path(want, art.file)
        candidates = [cached] + [d / art.file for d in wheel_dirs]
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            got = _download(entry["url"], cached, art.name)
            found = cached
        else:
            got = _sha256(found)
        if got != want:
            if found == cached:
                cached.unlink(missing_ok=True)
            raise UserError(f"{art.name}: {found} has sha256 {got}, but {lock_path(recipe).name} locks {want}; the "
                            "build was not started", f"remove {found} (a corrupted or different {art.file}) and build "
                            f"again, or, if the artifact changed on purpose, delete {lock_path(recipe).name} and run "
                            f"`ds4deploy image lock {recipe.base_name}`", code=1)
        out[art.file] = found
    return out

