"""What installing sortie weighs and takes (issue 63), measured side by side in one run: the
wheel built from this checkout, installed with plain pip (from the index pip is set to use)
into a bare virtualenv each, as a user would.

- wheel_core_mb: the installed size of `pip install sortie` (the controller alone; goal <=
  150 MB), its virtualenv's site-packages less a bare virtualenv's.
- wheel_one_cloud_mb_<cloud>: the same for `sortie[aws]`, `sortie[gcp]`, `sortie[azure]`.
- wheel_all_clouds_mb: `sortie[all]` (what every install weighed before the extras).
- pip_install_core_s: the seconds `pip install sortie` took (network included: a figure of
  this machine and its index).

The clouds' installs are made with uv where this environment has it (`make install` puts it in
`.venv`; `--pip` for plain pip): plain pip resolves `sortie[aws]` in minutes, backtracking
through boto3 releases until one agrees with the botocore that s3fs's aiobotocore pins (7 min
41 s once here, beside a test run); uv in seconds. The sizes are the same either way.

Prints `RESULT wheel_core_mb=…`, `RESULT wheel_one_cloud_mb_aws=…` (gcp, azure),
`RESULT wheel_all_clouds_mb=…`, `RESULT pip_install_core_s=…`.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INSTALLS = {"core": "", "aws": "[aws]", "gcp": "[gcp]", "azure": "[azure]", "all": "[all]"}


def size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()
               ) / 1e6


def site_packages(venv: Path) -> Path:
    version = sysconfig.get_python_version()
    return venv / "lib" / f"python{version}" / "site-packages"


def build_wheel(into: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(into), str(REPO)], check=True)
    (wheel,) = into.glob("sortie-*.whl")
    return wheel


def install(venv: Path, requirement: str, pip: bool) -> float:
    """Seconds the install of ``requirement`` took in a fresh virtualenv at ``venv``."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    uv = Path(sys.executable).parent / "uv"
    command = [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"] \
        if pip or not uv.exists() else [str(uv), "pip", "install", "-q", "--python",
                                         str(venv / "bin" / "python")]
    began = time.perf_counter()
    subprocess.run([*command, requirement], check=True)
    return time.perf_counter() - began


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="sortie-bench-install-") as tmp:
        root = Path(tmp)
        wheel = build_wheel(root / "dist")
        subprocess.run([sys.executable, "-m", "venv", str(root / "bare")], check=True)
        bare = size_mb(site_packages(root / "bare"))  # pip and setuptools, in every venv
        figures: dict[str, float] = {}
        for name, extra in INSTALLS.items():
            seconds = install(root / name, f"{wheel}{extra}",
                              pip=name == "core" or "--pip" in sys.argv)
            mb = size_mb(site_packages(root / name)) - bare
            print(f"{name}: {mb:.0f} MB installed in {seconds:.0f} s", flush=True)
            if name == "core":
                figures |= {"wheel_core_mb": mb, "pip_install_core_s": seconds}
            elif name == "all":
                figures["wheel_all_clouds_mb"] = mb
            else:
                figures[f"wheel_one_cloud_mb_{name}"] = mb
    for name, value in figures.items():
        print(f"RESULT {name}={value:.1f}")


if __name__ == "__main__":
    main()
