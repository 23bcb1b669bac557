"""The wheels the GPU check carries to a node with no network: what flm needs beyond a stock
PyTorch image, one pinned version each, never torch (the check runs on the image's own).

``python -m frontier_llm.gpucheck.wheels`` prints the pins one per line for
scripts/gpu-wheels.sh (standard library only: it runs before anything is installed).

:data:`IMAGE_PACKAGES` is the part of the GPU image's package list (this workplace's 'cuda'
image, as read on 2026-11-17: /work/.library/device/KINDS.md, "Python packages already there")
that flm's requirements and their dependencies touch. :data:`WHEELS` is every other
distribution those requirements pull in (tests/test_gpu_check.py checks that the two together
cover setup.cfg's install_requires, DeepSpeed, and each pinned wheel's own dependencies). The
versions are those the project's test environment resolves (pip install -e '.[dev]',
2026-11-26), so the GPU runs the code the suite ran.
"""

from __future__ import annotations

import sys

# (distribution, version, why it is carried). Pure-Python wheels except rpds-py, psycopg-binary
# and pydantic-core (manylinux x86-64 cp312). DeepSpeed publishes source only: gpu-wheels.sh
# builds its pure-Python wheel with DS_BUILD_OPS=0 (ops are JIT-compiled on the node if used).
WHEELS: tuple[tuple[str, str, str], ...] = (
    ("SQLAlchemy", "2.1.9", "install_requires (the store; flm's command modules import it)"),
    ("alembic", "1.20.1", "install_requires (store migrations)"),
    ("Mako", "1.4.3", "alembic"),
    ("optuna", "5.0.0", "install_requires (flm tune)"),
    ("colorlog", "6.12.0", "optuna"),
    ("jsonschema", "4.26.0", "install_requires (the trace schema)"),
    ("jsonschema-specifications", "2025.9.1", "jsonschema"),
    ("referencing", "0.37.0", "jsonschema"),
    ("rpds-py", "2026.9.1", "jsonschema, referencing"),
    ("fastjsonschema", "2.22.3", "install_requires"),
    ("psycopg", "3.3.9", "install_requires (PostgreSQL URLs)"),
    ("psycopg-binary", "3.3.9", "psycopg[binary]"),
    ("deepspeed", "0.19.8", "the dev extra: flm bench --engine deepspeed"),
    ("hjson", "3.1.0", "deepspeed"),
    ("pydantic", "2.14.4", "deepspeed"),
    ("pydantic-core", "2.50.5", "pydantic (pinned by it exactly)"),
    ("annotated-types", "0.8.0", "pydantic"),
    ("typing-inspection", "0.4.5", "pydantic"),
    # The image has typing-extensions, at a version not recorded; pydantic 2.14 needs >= 4.16.
    ("typing-extensions", "4.16.0", "pydantic, pydantic-core, alembic (a newer one than the "
     "image may hold)"),
)

# Built from source (no wheel on PyPI): gpu-wheels.sh runs pip wheel for these.
SOURCE_ONLY = frozenset({"deepspeed"})

IMAGE_PACKAGES = frozenset({
    "torch", "numpy", "pandas", "pyyaml", "jinja2", "markupsafe", "matplotlib", "scipy", "rich",
    "attrs", "packaging", "tqdm", "psutil", "py-cpuinfo", "ninja", "einops", "msgpack",
    "nvidia-ml-py", "typing-extensions", "colorama", "filelock", "fsspec", "networkx", "sympy",
    "triton", "python-dateutil", "pygments", "markdown-it-py", "mdurl", "six", "pillow",
    "pyparsing", "kiwisolver", "cycler", "fonttools", "contourpy",
})


def norm(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> list[str]:
    return [f"{name}=={version}" for name, version, _ in WHEELS]


if __name__ == "__main__":
    # gpu-wheels.sh: "NAME==VERSION<TAB>source|wheel" per line.
    for name, version, _ in WHEELS:
        kind = "source" if norm(name) in SOURCE_ONLY else "wheel"
        sys.stdout.write(f"{name}=={version}\t{kind}\n")
