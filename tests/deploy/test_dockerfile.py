"""The image that docker-compose.yml and the Helm chart run: it must hold every package lorahost installs."""

from __future__ import annotations

import re
import subprocess
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


def test_an_image_can_be_built_with_the_vllm_extra() -> None:
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    assert 'ARG LORAHOST_EXTRAS=""' in dockerfile
    install = re.search(r'^RUN pip install [^\n]*wheels ("\.[^"\n]*")$', dockerfile, flags=re.MULTILINE)
    assert install is not None
    target = install.group(1).strip('"')
    expand = {"": ".", "vllm": ".[vllm]"}  # POSIX ${VAR:+word} as the build's /bin/sh expands it
    for extras, expected in expand.items():
        result = subprocess.run(
            ["sh", "-c", f'LORAHOST_EXTRAS="{extras}"; echo {target}'],
            capture_output=True,
            text=True,
            check=True,
        )
        assert result.stdout.strip() == expected
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert "vllm" in pyproject["project"]["optional-dependencies"]
