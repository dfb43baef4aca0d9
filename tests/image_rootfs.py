"""The agent image's root filesystem for tests/test_image.py, built as the session starts.

Building it (mmdebstrap of the image's Debian packages, our wheels, the image's install steps) takes a
minute and a half, mostly downloads and unpacking, during which the image's tests could only wait: started
first, it runs beside the rest of the suite on the CPU time they leave idle (tests/beside.py), as the VM
tier's guest does.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from beside import Beside, idle_only

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
IMAGE = os.path.join(ROOT, "deploy", "image")
PATH = "/opt/nodehealth/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the Dockerfile's
ENV = {"PATH": PATH, "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8", "HOME": "/root"}  # in the root filesystem
# A step's limit: alone the build takes about 90 s; room for a suite that leaves it little idle time.
STEP_TIMEOUT_SECONDS = 1800
BUILD = pytest.StashKey["Build"]()  # config.stash: the session's build, where it has image tests


# Not a missing part: the tests skip on another Python even under CI.
OTHER_PYTHON = "the wheels are built by this Python for the image's Debian Python 3.11"


def missing() -> str | None:
    """Why the root filesystem cannot be built here, or None."""
    if os.geteuid() != 0:
        return "mmdebstrap and chroot need root"
    if not shutil.which("mmdebstrap"):
        return "mmdebstrap is not installed"
    if sys.version_info[:2] != (3, 11):
        return OTHER_PYTHON
    return None


def packages() -> list[str]:
    with open(os.path.join(IMAGE, "packages")) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def chroot(root, *argv: str) -> subprocess.CompletedProcess:
    """`argv` run in the root filesystem with the image's environment."""
    return subprocess.run(["chroot", str(root), *argv], capture_output=True, text=True, timeout=300, env=ENV)


class Build(Beside):
    """The root filesystem built in a thread of its own; `wait` gives its path, or raises why it failed."""

    def __init__(self, root: str):
        self.root = root
        super().__init__("image-rootfs")

    def work(self) -> str:
        self._step([shutil.which("mmdebstrap"), "--quiet", "--variant=apt", "--include=" + ",".join(packages()),
                    "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
                    "bookworm", self.root])
        self._step(["sh", os.path.join(IMAGE, "wheels.sh"), sys.executable, ROOT, os.path.join(self.root, "wheels")])
        shutil.copy(os.path.join(IMAGE, "install.sh"), os.path.join(self.root, "tmp", "install.sh"))
        self._step(["chroot", self.root, "sh", "/tmp/install.sh"], env=ENV)
        return self.root

    def _step(self, argv: list, env: dict | None = None) -> None:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                   preexec_fn=idle_only)
        self.started(process)
        try:
            _, stderr = process.communicate(timeout=STEP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise RuntimeError(f"{' '.join(argv[:3])} took over {STEP_TIMEOUT_SECONDS} s") from None
        if process.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:3])} failed: {stderr[-3000:]}")

    def stop(self) -> None:
        """An ended session leaves no step running, and no root filesystem."""
        super().stop()
        shutil.rmtree(self.root, ignore_errors=True)
