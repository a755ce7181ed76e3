"""Render DOT to PNG or SVG with the Graphviz ``dot`` program, when it is installed.

Graphviz is a system program, not a Python package: memtree calls it as a
subprocess and says how to install it when it is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Literal

ImageFormat = Literal["png", "svg"]
IMAGE_FORMATS: tuple[str, ...] = ("png", "svg")

INSTALL_HINT = (
    "install Graphviz (Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz), "
    "or write DOT with memtree.viz.to_dot(memory) / `memtree show --format dot` and render it elsewhere"
)


class GraphvizNotFoundError(RuntimeError):
    """The Graphviz ``dot`` program is not on ``PATH``."""


def dot_program() -> str | None:
    """The path of Graphviz's ``dot``, or ``None`` when it is not installed."""
    return shutil.which("dot")


def render_dot(source: str, image_format: ImageFormat = "png") -> bytes:
    """The image ``dot`` draws from ``source``.

    Raises :class:`GraphvizNotFoundError` (naming ``apt-get install graphviz``) when
    ``dot`` is missing and ``RuntimeError`` with dot's own message when it fails.
    """
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"image_format must be one of {', '.join(IMAGE_FORMATS)}, got {image_format!r}")
    program = dot_program()
    if program is None:
        raise GraphvizNotFoundError(f"Graphviz `dot` is not installed; {INSTALL_HINT}")
    done = subprocess.run(
        [program, f"-T{image_format}"], input=source.encode("utf-8"), capture_output=True, check=False
    )
    if done.returncode != 0 or not done.stdout:
        message = done.stderr.decode("utf-8", "replace").strip() or f"exit status {done.returncode}"
        raise RuntimeError(f"Graphviz dot failed to draw the tree: {message}")
    return done.stdout


def render_dot_to(source: str, image_format: ImageFormat, path: str | os.PathLike[str] | None) -> bytes:
    """:func:`render_dot`, also written to ``path`` when one is given."""
    image = render_dot(source, image_format)
    if path is not None:
        with open(path, "wb") as file:
            file.write(image)
    return image
