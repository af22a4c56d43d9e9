"""A wheel built from the checkout installs into a fresh venv and runs from a directory outside the checkout.

The wheel is built offline as docs/guide/install.md says (``pip wheel --no-deps --no-build-isolation``
with the project venv's setuptools), from a copy of the checkout. The fresh venv has no system
site-packages and never sees the checkout: the wheel is installed with ``--no-deps --no-index``, and its
dependencies come from a directory of links to the project venv's installed packages, phaserunner's own
editable install left out (a ``.pth`` line adds that directory; its own ``.pth`` files are not run). So
``pipelines``, ``adapters`` and ``phases`` can only come from the wheel: ``pip check`` proves the
dependencies it declares are met, ``pipelines --help`` and the README's Quickstart run there, and every
package of the checkout, each ``py.typed`` and the web page's files are in the installed tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.readme_blocks import blocks

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipelines", "adapters", "phases")
SKIP = shutil.ignore_patterns(".venv", ".git", "site", "build", "dist", "*.egg-info", "__pycache__", "node_modules",
                              ".mypy_cache", ".ruff_cache", ".pytest_cache", "peers")
OWN = ("__editable__", "__editable___phaserunner", "phaserunner-", "_phaserunner")

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    out = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(map(str, args))}\n{out.stdout}{out.stderr}"
    return out.stdout


def package_dirs(root: Path) -> set[str]:
    """The packages under ``root`` (directories with an ``__init__.py``), as relative paths."""
    return {str(p.parent.relative_to(root)) for name in PACKAGES for p in (root / name).rglob("__init__.py")
            if "__pycache__" not in p.parts}


def test_the_wheel_installs_into_a_fresh_venv_and_runs_outside_the_checkout(tmp_path: Path) -> None:
    offline = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    src = tmp_path / "checkout"
    shutil.copytree(ROOT, src, ignore=SKIP, symlinks=True)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist", src,
        cwd=tmp_path, env=offline)
    [wheel] = (tmp_path / "dist").glob("phaserunner-*.whl")

    env_dir = tmp_path / "env"
    run(sys.executable, "-m", "venv", env_dir, cwd=tmp_path)  # no --system-site-packages
    python = env_dir / "bin" / "python"
    deps = tmp_path / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(OWN):
            (deps / entry.name).symlink_to(entry)
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).strip())
    (site / "project-deps.pth").write_text(f"{deps}\n")
    run(python, "-m", "pip", "install", "--no-deps", "--no-index", wheel, cwd=tmp_path, env=offline)
    run(python, "-m", "pip", "check", cwd=tmp_path, env=offline)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    clean = {k: v for k, v in offline.items() if k not in ("PYTHONPATH", "PIPELINES_APP")}
    clean.update(PATH=os.pathsep.join([str(env_dir / "bin"), "/usr/bin", "/bin"]))
    where = run(python, "-c", "import sys, pipelines, adapters, phases; print(pipelines.__file__); "
                "print(adapters.__file__); print(phases.__file__); print('\\n'.join(sys.path))", cwd=elsewhere,
                env=clean)
    assert all(line.startswith(str(site)) for line in where.splitlines()[:3]), where
    assert str(ROOT) not in where, "the fresh venv sees the checkout"

    # Every package of the checkout, its py.typed and the web page's files came with the wheel.
    assert package_dirs(site) == package_dirs(ROOT)
    for name in PACKAGES:
        assert (site / name / "py.typed").is_file(), name
    for relative in ("pipelines/web/static", "pipelines/web/templates"):
        shipped = {p.name for p in (ROOT / relative).iterdir() if p.is_file()}
        assert shipped and shipped <= {p.name for p in (site / relative).iterdir()}, relative

    usage = run("pipelines", "--help", cwd=elsewhere, env=clean)
    assert usage.startswith("usage: pipelines") and "worker" in usage and "agent" in usage
    quickstart = next(b for b in blocks() if b.section == "Quickstart" and b.lang == "python")
    (elsewhere / "quickstart.py").write_text(quickstart.text)
    out = run(python, "quickstart.py", cwd=elsewhere, env=clean)
    assert out == "complete It has shipped.\n['system', 'user', 'assistant', 'tool', 'assistant']\n"
