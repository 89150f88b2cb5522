"""Model staging: put a recipe's model files into a directory on the control host and check them against the
recipe's committed manifest, before anything copies them to the nodes.

A recipe's ``model.source`` says where the files come from: ``generated`` (the tiny test checkpoint,
`ds4deploy.model.tiny`, or for a llama.cpp recipe (``model.gguf`` set) the tiny deepseek4 GGUF in the recipe's
gguf-split layout, `ds4deploy.model.tiny_gguf`), ``hub`` (the pinned revision, `ds4deploy.model.fetch.fetch_model`),
or ``local`` (placed on the nodes by hand; nothing to stage). `ds4deploy model stage` (the deploy's staging step)
and `ds4deploy bundle create` (the air-gapped bundle) both use `obtain`; `stage` adds the check and the sha256 of
every file.

A generated GGUF needs ``chat_template`` (`ds4deploy.model.generated`).
"""

from __future__ import annotations

from pathlib import Path

from ds4deploy.core.errors import UserError
from ds4deploy.recipe.model_config import check_staged
from ds4deploy.recipe.schema import Recipe


def _require_pinned(recipe: Recipe) -> None:
    if recipe.model.source == "local":
        raise UserError(
            f"recipe '{recipe.name}' uses model.source 'local': there is no pinned model to stage or bundle",
            f"pin the model (model.source: hub, repo_id, revision), or place the files in {recipe.model.path} on "
            f"every node and start the rendered stack with docker compose (compose/{recipe.name}/)",
        )


def check_source(recipe: Recipe, model_from: Path | None = None) -> None:
    """The model can be staged the way `ds4deploy model stage` stages it, checked without fetching or hashing
    anything (the deploy runs this on the control host before any node is read or changed, and `ds4deploy
    preflight` runs it too).

    Args:
        recipe: the recipe.
        model_from: ``MODEL_FROM`` / ``--from``: a local model's file or directory on the control host, or None.

    Raises:
        UserError: `model_from` for a recipe whose model is not local; `model_from` missing or empty on this host;
            a local model with neither `model_from` nor a committed manifest (nothing says what the nodes' copies
            must hold); a committed manifest that cannot be read; a llama.cpp recipe whose GGUF parts are not all in
            `model_from` or the manifest (`_check_gguf_parts`: a model that is not GGUF, a part missing).
    """
    from ds4deploy.model.manifest import load_manifest, manifest_path

    if model_from is not None:
        if recipe.model.source != "local":
            raise UserError(f"--from names a local model's files, but recipe '{recipe.name}' has model.source "
                            f"'{recipe.model.source}'", "leave out --from (MODEL_FROM=)")
        from ds4deploy.model.lock import local_files

        root, names = local_files(model_from)
        _check_gguf_parts(recipe, names, str(root),
                          f"point MODEL_FROM (--from) at the directory that holds every part, or correct "
                          f"model.gguf in recipes/{recipe.base_name}.yaml and run `ds4deploy render`")
    if manifest_path(recipe).is_file() or (recipe.model.source == "local" and model_from is None):
        manifest = load_manifest(recipe)  # a local model without one: names `model lock --from` as the fix
        lock = f"ds4deploy model lock {recipe.base_name}" + (" --from PATH" if recipe.model.source == "local" else "")
        _check_gguf_parts(recipe, list(manifest["files"]), manifest_path(recipe).name,
                          f"lock the model from a copy that holds every part: delete {manifest_path(recipe).name} "
                          f"and run `{lock}`")
        if recipe.model.source == "local":
            local_sha256(recipe, manifest)


def _check_gguf_parts(recipe: Recipe, names: list[str], where: str, fix: str) -> None:
    """A llama.cpp recipe's GGUF parts (`ds4deploy.engines.llamacpp.gguf_parts`: part 1, which ``-m`` names, and
    the parts llama-server opens by the names derived from it) are all among `names` (the files of a manifest or of a
    local model directory); other recipes pass.

    Raises:
        UserError: naming the parts `where` lacks (a model that is not this GGUF, or a split model with a part
            missing), with `fix`.
    """
    g = recipe.model.gguf
    if g is None:
        return
    from ds4deploy.engines.llamacpp import gguf_parts

    parts = gguf_parts(g.file, g.parts)
    missing = [n for n in parts if n not in set(names)]
    if missing:
        have = [n for n in names if n.endswith(".gguf")]
        raise UserError(
            f"recipe '{recipe.name}' loads the GGUF {g.file} in {g.parts} part(s), and {where} lacks "
            f"{', '.join(missing)} (" + (f"its GGUF files: {', '.join(have[:5])}" if have else "it holds no GGUF "
                                         "file: llama-server loads GGUF only") + ")", fix)


def local_sha256(recipe: Recipe, manifest: dict) -> dict[str, str]:
    """A local model's file -> sha256 from its manifest: what every node's copy is checked against.

    Raises:
        UserError: an entry without sha256 (a git blob sha1 cannot check a file on a node).
    """
    from ds4deploy.model.manifest import manifest_path

    no_sha = [n for n, f in manifest["files"].items() if not f.get("sha256")]
    if no_sha:
        raise UserError(f"{manifest_path(recipe).name} records no sha256 for {', '.join(no_sha[:5])}: a local "
                        "model's files are checked on each node by sha256",
                        f"delete it and run `ds4deploy model lock {recipe.base_name} --from PATH`")
    return {n: f["sha256"] for n, f in manifest["files"].items()}


def obtain(recipe: Recipe, dest: Path, manifest: dict | None = None, chat_template: str | None = None) -> None:
    """Generate (``generated``, `ds4deploy.model.generated.generate_model`; `chat_template` for a GGUF) or fetch
    (``hub``, only files that do not match `manifest` are downloaded) the recipe's model into `dest`.

    Raises:
        UserError: ``model.source: local`` (there is no pinned model to stage); generator or fetch errors.
    """
    _require_pinned(recipe)
    if recipe.model.source == "generated":
        from ds4deploy.model.generated import generate_model

        generate_model(recipe, dest, chat_template)
    else:
        from ds4deploy.model.fetch import fetch_model

        fetch_model(recipe, dest, manifest)


def _copy(src: Path, dest: Path, manifest: dict) -> None:
    """Copy the manifest's files from `src` into `dest` (each through a ``.ds4-partial`` file, then renamed)."""
    import shutil

    dest.mkdir(parents=True, exist_ok=True)
    for name in manifest["files"]:
        if not (src / name).is_file():
            raise UserError(f"{src} has no model file {name}", "make a new bundle")
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        tmp = dest / (name + ".ds4-partial")
        shutil.copyfile(src / name, tmp)
        tmp.replace(dest / name)


def stage(recipe: Recipe, dest: Path, copy_from: Path | None = None, chat_template: str | None = None) -> dict:
    """Stage the recipe's model into `dest` and verify it against the committed manifest.

    Args:
        recipe: a recipe with a pinned model (``generated`` or ``hub``).
        dest: the staging directory on the control host.
        copy_from: a bundle's model directory (`ds4deploy.plan.bundle`): copy the files from there instead of
            generating or fetching them (offline), and re-hash every file (no sidecar) to check them.
        chat_template: the jinja a generated GGUF embeds (`obtain`); unused otherwise.
    Files already matching in `dest` are not fetched or copied again (the generator rewrites only changed files).

    Returns:
        ``{"changed": bool, "dest": str, "sha256": {file: hex}}`` (what the nodes' copies are checked against).
    Raises:
        UserError: ``model.source: local`` or a file missing from `copy_from` (code 2); the staged files do not
            match the manifest (code 1); the recipe asks for more than the model's config.json allows
            (`ds4deploy.recipe.model_config.check_staged`).
    """
    from ds4deploy.model.manifest import load_manifest, manifest_path, sha256_map, verify_dir
    from ds4deploy.model.verify import verify_model

    _require_pinned(recipe)
    manifest = load_manifest(recipe)

    def problems() -> list[str]:
        if copy_from is not None:
            return verify_dir(dest, manifest)
        return verify_model(dest, manifest).problems()

    before = problems() if dest.is_dir() else ["absent"]
    if copy_from is not None:
        if before:
            _copy(copy_from, dest, manifest)
    elif recipe.model.source != "hub" or before:
        obtain(recipe, dest, manifest, chat_template)
    after = problems()
    if after:
        fix = (f"delete {dest} and verify the bundle (`ds4deploy bundle verify`)" if copy_from is not None else
               f"if the recipe's model changed on purpose, rebuild the manifest (delete it and run `ds4deploy model "
               f"lock {recipe.base_name}`); otherwise delete {dest} and deploy again")
        raise UserError(f"the staged model in {dest} does not match {manifest_path(recipe).name}:\n  "
                        + "\n  ".join(after), fix, code=1)
    check_staged(recipe, dest)  # the limits the model's own config.json sets (native context)
    return {"changed": bool(before), "dest": str(dest), "sha256": sha256_map(dest, manifest)}
