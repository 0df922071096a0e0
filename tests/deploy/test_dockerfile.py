"""The image that docker-compose.yml and the Helm chart run: it must hold every package lorahost installs."""

from __future__ import annotations

import re
import tomllib

from tests.deploy.manifests import REPO_ROOT


def test_image_copies_every_installed_package() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    packages = {
        pattern.rstrip("*") for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    copied = set(re.findall(r"^COPY (\w+) \1$", (REPO_ROOT / "Dockerfile").read_text(), flags=re.MULTILINE))
    assert packages <= copied, f"Dockerfile misses COPY for {sorted(packages - copied)}"


def test_image_has_a_c_compiler_for_the_cpu_kernels() -> None:
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    install = re.search(r"apt-get install [^\n]*", dockerfile)
    assert install and {"gcc", "libc6-dev"} <= set(install.group(0).split())
