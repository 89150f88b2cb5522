"""The bytes of a ``generated`` recipe's model: the tiny safetensors checkpoint (`ds4deploy.model.tiny`) or, for a
llama.cpp recipe (``model.gguf`` set), the tiny deepseek4 GGUF in the recipe's gguf-split layout
(`ds4deploy.model.tiny_gguf`). Staging (`ds4deploy.model.staging`) writes them, the manifest lock
(`ds4deploy.model.lock`) hashes them; both ask here.

The tiny GGUF embeds the model's own chat template, which comes from the llama.cpp source locked for the recipe's
image (a build artifact, `ds4deploy.build.image.generated_chat_template`); the build layer sits above this one, so
whoever generates a GGUF (the CLI, the bundle) reads it there and passes it in as ``chat_template``.
"""

from __future__ import annotations

from pathlib import Path

from ds4deploy.core.errors import UserError
from ds4deploy.model.tiny import generator_spec
from ds4deploy.recipe.schema import Recipe


def _template(recipe: Recipe, chat_template: str | None) -> str:
    """`chat_template`, or a UserError when a GGUF is to be generated without it."""
    if chat_template is None:
        raise UserError(f"recipe '{recipe.name}': the tiny GGUF needs the chat template of the locked llama.cpp "
                        "source, and none was passed", "stage it with `ds4deploy model stage` (it reads the template "
                        "from the artifact recipes/<recipe>.lock.json locks)")
    return chat_template


def generated_files(recipe: Recipe, chat_template: str | None = None) -> dict[str, bytes]:
    """Every file of a ``generated`` recipe's model, as bytes, keyed by name: the tiny deepseek4 GGUF parts for a
    llama.cpp recipe (``model.gguf`` set; `chat_template` is the jinja the GGUF embeds), else the tiny safetensors
    checkpoint (`chat_template` unused).

    Raises:
        UserError: the model is not generated; a GGUF without `chat_template`.
    """
    if recipe.model.gguf is not None:
        from ds4deploy.model import tiny_gguf

        return tiny_gguf.files(tiny_gguf.recipe_spec(recipe), _template(recipe, chat_template))
    from ds4deploy.model.tiny import files

    return files(generator_spec(recipe))


def generate_model(recipe: Recipe, dest: Path, chat_template: str | None = None) -> list[str]:
    """Write a ``generated`` recipe's model (`generated_files`) into `dest`, touching only files whose bytes differ.

    Returns:
        Names of the files created or replaced.
    Raises:
        UserError: as `generated_files`; `dest` cannot be written.
    """
    if recipe.model.gguf is not None:
        from ds4deploy.model import tiny_gguf

        return tiny_gguf.generate(dest, tiny_gguf.recipe_spec(recipe), _template(recipe, chat_template))
    from ds4deploy.model.tiny import generate

    return generate(dest, generator_spec(recipe))
