"""What this machine's Docker daemon says of an image, read the way the deploy reads it."""

from __future__ import annotations

import subprocess

# The label a deploy builds the engine image with and compares before it builds again (ansible/roles/image/tasks/
# build.yml; the value is ds4deploy.build.image.context_digest).
CONTEXT_LABEL = "io.ds4deploy.context-sha256"


def context_label(ref: str) -> str:
    """The image's build context digest label ("" when the image or the label is missing)."""
    return subprocess.run(["docker", "image", "inspect", "--format", f'{{{{index .Config.Labels "{CONTEXT_LABEL}"}}}}',
                           ref], capture_output=True, text=True, check=False).stdout.strip()
