"""The pip package (pyproject.toml): `python -m pip wheel .` builds a wheel that installs into a
fresh virtualenv, where `import scalesweep` works with no PYTHONPATH and the `scalesweep` CLI
is on the venv's PATH, both with the version of CMakeLists.txt's project(); then it uninstalls
cleanly.

Building the wheel compiles the whole library in an isolated build (15 minutes on a loaded
2-core machine; scikit-build-core starts build/pip/ over when its own temporary path changes,
ccache shortens it), so this test runs only with SS_TEST_WHEEL=1 and skips visibly otherwise:

    SS_TEST_WHEEL=1 python3 -m pytest -q python/tests/test_package.py

It needs pip to reach its index (or cache) for scikit-build-core, pybind11 and numpy.
"""
import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    os.environ.get("SS_TEST_WHEEL") != "1",
    reason="builds the wheel (minutes): set SS_TEST_WHEEL=1 to run it")


def run(cmd, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env,
                       timeout=3600, **kw)
    assert p.returncode == 0, f"{cmd}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


def test_wheel_installs_into_fresh_venv(tmp_path):
    version = re.search(r"project\(scalesweep VERSION ([0-9.]+)",
                        (REPO / "CMakeLists.txt").read_text()).group(1)
    run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-w", tmp_path / "wheels"],
        cwd=REPO)
    wheels = list((tmp_path / "wheels").glob("scalesweep-*.whl"))
    assert len(wheels) == 1 and wheels[0].name.startswith(f"scalesweep-{version}-")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv])
    py, bindir = venv / "bin" / "python", venv / "bin"
    run([py, "-m", "pip", "install", "-q", wheels[0]])
    code = ("import scalesweep as ss, numpy as np, sys; "
            "q = ss.quantize(np.ones((2, 32), np.float32)); "
            "print(ss.__version__, ss.__file__, q.codes.shape, 'torch' in sys.modules)")
    out = run([py, "-c", code], cwd=tmp_path).split()
    assert out[0] == version
    assert pathlib.Path(out[1]).is_relative_to(venv)  # the installed copy, not the checkout
    assert out[2:4] == ["(2,", "16)"] and out[4] == "False"
    assert run([bindir / "scalesweep", "--version"]).strip() == f"scalesweep {version}"
    run([py, "-m", "pip", "uninstall", "-y", "-q", "scalesweep"])
    assert not (bindir / "scalesweep").exists()
    p = subprocess.run([str(py), "-c", "import scalesweep"], capture_output=True, text=True,
                       cwd=tmp_path, env={k: v for k, v in os.environ.items()
                                          if k != "PYTHONPATH"})
    assert p.returncode != 0 and "No module named 'scalesweep'" in p.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the bare-system check needs root (chroot)")
def test_portable_wheel_runs_on_a_bare_debian(tmp_path):
    """scripts/wheel.sh: the repaired wheel bundles the shared libraries (no Debian -dev or
    runtime package of the build in it is needed); scripts/test-wheel.sh installs it in a
    debootstrap chroot without them and runs the module and the CLI there."""
    out = run([REPO / "scripts" / "wheel.sh", tmp_path / "dist"], cwd=REPO)
    wheel = pathlib.Path(out.strip().splitlines()[-1])
    assert re.search(r"-manylinux_2_\d+_x86_64\.whl$", wheel.name), wheel.name
    import zipfile
    names = zipfile.ZipFile(wheel).namelist()
    bundled = [n for n in names if n.startswith("scalesweep.libs/")]
    for lib in ("libopenblas", "libhwy", "libgomp"):
        assert any(lib in n for n in bundled), (lib, bundled)
    report = run([REPO / "scripts" / "test-wheel.sh", wheel])
    assert "installs and runs on a bare Debian 12" in report
