"""Boot Debian's stock kernel in QEMU (TCG) once, and run a batch of scenarios inside it.

The guest's root is the host's root over 9p, read-only, under a RAM-backed overlay, so the guest
runs this checkout, its venv and the host's packages (rdma-core, perftest, python3-pyverbs) with
no image to build. The initramfs is busybox plus the few modules that mount that root; it is
built here, in Python (cpio newc), for the kernel under /boot. The batch is one shell script run
as root in the guest; what it writes under $OUT (a second, writable 9p share) comes back.
"""
from __future__ import annotations

import glob
import os
import shutil
import stat
import subprocess
import time
from typing import Callable

from beside import idle_only

ROOT_MODULES = ("virtio_ring", "virtio", "virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio_pci",
                "netfs", "fscache", "9pnet", "9pnet_virtio", "9p", "overlay")

INIT = """#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /host /rw /newroot
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox mount -t devtmpfs dev /dev
for m in {modules}; do /bin/busybox insmod /modules/$m.ko || echo "nh-vm: insmod $m failed"; done
/bin/busybox mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot /host
/bin/busybox mount -t tmpfs -o size=1536m rw /rw
/bin/busybox mkdir -p /rw/upper /rw/work
/bin/busybox mount -t overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work overlay /newroot
/bin/busybox mkdir -p /newroot/nh-out
/bin/busybox mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 out /newroot/nh-out
for d in proc sys dev; do /bin/busybox mount --move /$d /newroot/$d; done
{keep}/bin/busybox mount -t tmpfs tmp /newroot/tmp
/bin/busybox mount -t tmpfs run /newroot/run
{restore}echo "nh-vm: root ready"
# switch_root, not chroot: the kernel's own helpers (module autoload) must see the new root too
exec /bin/busybox switch_root /newroot /bin/sh -c 'cd {cwd} && OUT=/nh-out /bin/sh {script} \
> /nh-out/console.log 2>&1; echo $? > /nh-out/rc; sync; echo o > /proc/sysrq-trigger; sleep 10'
"""


class Unavailable(Exception):
    """QEMU, the kernel or busybox is not there, or the guest cannot boot."""


def kernel() -> tuple[str, str]:
    """The newest stock kernel under /boot and its release."""
    images = sorted(glob.glob("/boot/vmlinuz-*"))
    if not images:
        raise Unavailable("no kernel under /boot (.ci/run installs linux-image-amd64)")
    image = images[-1]
    release = os.path.basename(image)[len("vmlinuz-"):]
    if not os.path.isdir(f"/lib/modules/{release}"):
        raise Unavailable(f"no /lib/modules/{release} for {image}")
    return image, release


def _cpio(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A cpio 'newc' archive of (name, mode, data) entries."""
    out = bytearray()
    for ino, (name, mode, data) in enumerate(entries + [("TRAILER!!!", 0, b"")], start=1):
        raw = name.encode() + b"\0"
        head = "070701" + "".join(f"{v:08x}" for v in (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(raw), 0))
        out += head.encode() + raw
        out += b"\0" * (-len(out) % 4)
        out += data
        out += b"\0" * (-len(out) % 4)
    return bytes(out)


def build_initramfs(path: str, release: str, script: str, cwd: str) -> None:
    busybox = shutil.which("busybox")
    if not busybox:
        raise Unavailable("busybox is not installed (.ci/run installs busybox-static)")
    with open(busybox, "rb") as f:
        bb = f.read()
    dirs = ["bin", "modules", "proc", "sys", "dev"]
    entries = [(d, stat.S_IFDIR | 0o755, b"") for d in dirs]
    entries.append(("bin/busybox", stat.S_IFREG | 0o755, bb))
    mods = []
    for m in ROOT_MODULES:
        found = glob.glob(f"/lib/modules/{release}/kernel/**/{m}.ko", recursive=True)
        if found:  # absent: built into this kernel
            with open(found[0], "rb") as f:
                entries.append((f"modules/{m}.ko", stat.S_IFREG | 0o644, f.read()))
            mods.append(m)
    # A checkout under /tmp or /run (a CI clone may be there) would vanish under the guest's own
    # tmpfs: it is set aside before and put back after, at the same path.
    hidden = cwd.startswith(("/tmp/", "/run/"))
    keep = f"/bin/busybox mkdir -p /keep\n/bin/busybox mount --bind /newroot{cwd} /keep\n" if hidden else ""
    restore = f"/bin/busybox mkdir -p /newroot{cwd}\n/bin/busybox mount --move /keep /newroot{cwd}\n" if hidden else ""
    init = INIT.format(modules=" ".join(mods), script=script, cwd=cwd, keep=keep, restore=restore)
    entries.append(("init", stat.S_IFREG | 0o755, init.encode()))
    with open(path, "wb") as f:
        f.write(_cpio(entries))


def build_module(release: str, source: str, dest: str) -> str:
    """Build the printk module in `source` against linux-headers for `release`; the .ko's path."""
    build = f"/lib/modules/{release}/build"
    if not os.path.isdir(build):
        raise Unavailable(f"no {build} (.ci/run installs linux-headers-amd64 of the kernel's version)")
    work = os.path.join(dest, "printk-build")
    shutil.copytree(source, work)
    p = subprocess.run(["make", "-s", "-C", build, f"M={work}", "modules"], capture_output=True, text=True,
                       timeout=300)
    ko = os.path.join(work, "nh_printk.ko")
    if p.returncode != 0 or not os.path.exists(ko):
        raise Unavailable(f"the printk module did not build: {(p.stdout + p.stderr)[-1500:]}")
    return shutil.copy(ko, os.path.join(dest, "nh_printk.ko"))


def run_batch(script: str, out_dir: str, work_dir: str, cwd: str, timeout: float = 900,
              memory_mb: int = 3072, env: dict[str, str] | None = None, icount: bool = False,
              idle: bool = False, started: Callable[[subprocess.Popen], None] | None = None
              ) -> tuple[int, str, float]:
    """Boot, run `script` (a path on the host) in the guest, power off. Returns (rc, serial log, seconds).
    With `icount` the guest's clock counts its instructions (one nanosecond each) instead of following
    the host's: what it measures no longer depends on the host's load. It has one vCPU then (QEMU 7.2
    hangs bringing up a second one under -icount). With `idle` QEMU runs on the host's idle time only
    (SCHED_IDLE): whatever else wants a CPU takes it first. `started` is given the QEMU process as soon as it
    runs (a caller in another thread can kill it)."""
    qemu = shutil.which("qemu-system-x86_64")
    if not qemu:
        raise Unavailable("qemu-system-x86_64 is not installed (.ci/run installs qemu-system-x86)")
    image, release = kernel()
    initrd = os.path.join(work_dir, "initramfs.cpio")
    shutil.copy(script, os.path.join(out_dir, "batch.sh"))  # the guest's /tmp is its own
    with open(os.path.join(out_dir, "env.sh"), "w") as f:  # the guest starts with no environment of ours
        f.writelines(f"export {k}='{v}'\n" for k, v in (env or {}).items())
    build_initramfs(initrd, release, "/nh-out/batch.sh", cwd)
    cmd = [qemu, "-M", "pc", "-accel", "tcg", "-cpu", "max", "-smp", "1" if icount else "2", "-m", str(memory_mb),
           "-nographic",
           "-no-reboot", "-kernel", image, "-initrd", initrd,
           "-append", "console=ttyS0 panic=-1 quiet loglevel=4",
           "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on",
           "-virtfs", f"local,path={out_dir},mount_tag=out,security_model=none",
           "-net", "none"] + (["-icount", "shift=0"] if icount else [])
    start = time.monotonic()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, errors="replace", preexec_fn=idle_only if idle else None)
    if started:
        started(p)
    try:
        serial, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        serial, _ = p.communicate()
        raise Unavailable(f"the guest did not finish in {timeout:g} s: {serial[-2000:]!r}") from None
    elapsed = time.monotonic() - start
    rc_file = os.path.join(out_dir, "rc")
    if not os.path.exists(rc_file):
        raise Unavailable(f"the guest never ran the batch (qemu exit {p.returncode}): {serial[-3000:]}")
    with open(rc_file) as f:
        return int(f.read().strip() or 99), serial, elapsed
