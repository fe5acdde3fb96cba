"""Build the lab's disk images, one per lab OS (debian12, the default, and debian13;
lab/recipe.py), each cached and keyed by its recipe hash.

Two stages, each cached on its own:

1. rootfs: ``debootstrap`` of the recipe's packages (minutes, network-bound), kept as a
   directory ``images/rootfs-<hash>`` so tweaking guest files does not re-download.
2. image: copy the rootfs, configure it (guest files, keys, units, GRUB files), then
   build an MBR-partitioned raw disk without loop devices: ``mke2fs -d`` populates the
   ext4 root partition at a 1 MiB offset (e2fsprogs' ``-E offset=``), and GRUB's own
   ``boot.img``/``core.img`` (made by the guest's ``grub-mkimage``) go into the MBR and
   the post-MBR gap, which is what ``grub-bios-setup`` does. Loop partition devices
   are not used because some build kernels (this CI's included) do not create them.

The guest boots through real GRUB from the disk; ``update-grub`` inside the guest
regenerates /boot/grub/grub.cfg, so kernel command-line changes made by a deploy
take effect on reboot.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lab.keys import ensure_keys, public_key
from lab.recipe import DEFAULT_OS, Recipe, grub_cmdline, load_recipe, recipe_file_for
from lab.state import images_dir

SECTOR = 512
PART_START = 2048  # sectors: the first partition starts at 1 MiB, as parted/fdisk align
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
# GRUB i386-pc boot.img layout (grub-core/boot/i386/pc/boot.S, include/grub/i386/pc/boot.h):
# the MBR code ends at 0x1b8 (disk signature + partition table follow) and the
# 2-byte "jmp" at GRUB_BOOT_MACHINE_DRIVE_CHECK (0x66) is replaced by two NOPs for
# hard disks by grub-bios-setup (util/setup.c).
MBR_CODE_END = 0x1B8
DRIVE_CHECK = 0x66

Log = Callable[[str], None]


def _log(msg: str) -> None:
    print(f"lab: {msg}", file=sys.stderr, flush=True)


def image_path(recipe: Recipe, home: Path | None = None, os_name: str = DEFAULT_OS) -> Path:
    client, hostkey = ensure_keys(home)
    digest = recipe.image_hash(public_key(client), public_key(hostkey))
    return images_dir(home) / f"{os_name}-{digest[:16]}.raw"


def rootfs_path(recipe: Recipe, home: Path | None = None, os_name: str = DEFAULT_OS) -> Path:
    """The debootstrap tree of a recipe (Debian 12's keeps its historical name)."""
    prefix = "rootfs-" if os_name == DEFAULT_OS else f"rootfs-{os_name}-"
    return images_dir(home) / f"{prefix}{recipe.rootfs_hash()[:16]}"


def _same_os_rootfs(path: Path, os_name: str) -> bool:
    rest = path.name.removeprefix("rootfs-")
    if os_name != DEFAULT_OS:
        return rest.startswith(f"{os_name}-")
    return re.fullmatch(r"[0-9a-f]{16}(\.tmp)?", rest) is not None


@contextmanager
def _build_lock(home: Path | None) -> Iterator[None]:
    """One build at a time per lab home (two `lab up` at once share the result)."""
    d = images_dir(home)
    d.mkdir(parents=True, exist_ok=True)
    with open(d / ".build.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_image(home: Path | None = None, log: Log = _log, os_name: str = DEFAULT_OS) -> Path:
    """Return the cached base image of lab OS ``os_name``'s current recipe, building it
    if needed."""
    recipe = load_recipe(recipe_file_for(os_name))
    img = image_path(recipe, home, os_name)
    if img.exists():
        return img
    with _build_lock(home):
        if img.exists():
            return img
        if os.geteuid() != 0:
            raise RuntimeError("building the lab image needs root (debootstrap, chroot, "
                               "mount); run `python -m lab up` as root once")
        t0 = time.monotonic()
        log(f"building the lab image {img.name} (recipe changed or first run; minutes)")
        rootfs = _ensure_rootfs(recipe, home, log, os_name)
        work = images_dir(home) / f"build-{img.stem}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        try:
            tree = work / "rootfs"
            log("copying the rootfs")
            subprocess.run(["cp", "-a", str(rootfs), str(tree)], check=True)
            (tree / ".gpuserve-rootfs-done").unlink()
            fs_uuid = str(uuid.uuid4())
            _configure(tree, recipe, fs_uuid, home, log)
            disk = work / "disk.raw"
            _make_disk(tree, disk, recipe.disk_size_gib, fs_uuid, log)
            os.chmod(disk, 0o444)
            os.replace(disk, img)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log(f"image built in {time.monotonic() - t0:.0f}s: {img}")
        _prune(img, home, log, os_name)
    return img


def _prune(keep: Path, home: Path | None, log: Log, os_name: str = DEFAULT_OS) -> None:
    """Drop images of older recipes, except those a running instance still uses
    (its overlay needs the backing file for as long as it runs)."""
    from lab.state import list_instances, pid_alive, read_state

    in_use = set()
    for name in list_instances(home):
        st = read_state(name, home)
        if st is not None and pid_alive(st.pid):
            in_use.add(Path(st.image).name)
    for old in images_dir(home).glob(f"{os_name}-*.raw"):
        if old != keep and old.name not in in_use:
            log(f"removing old image {old.name}")
            old.unlink(missing_ok=True)


def _ensure_rootfs(recipe: Recipe, home: Path | None, log: Log,
                   os_name: str = DEFAULT_OS) -> Path:
    root = rootfs_path(recipe, home, os_name)
    if (root / ".gpuserve-rootfs-done").exists():
        log(f"reusing debootstrap tree {root.name}")
        return root
    for old in images_dir(home).glob("rootfs-*"):  # older trees of this OS only
        if _same_os_rootfs(old, os_name):
            shutil.rmtree(old, ignore_errors=True)
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = ["debootstrap", f"--variant={recipe.variant}",
           f"--include={','.join(recipe.packages)}",
           "--components=main"]
    if KEYRING.exists():
        cmd.append(f"--keyring={KEYRING}")
    cmd += [recipe.suite, str(tmp), recipe.mirror]
    log(f"debootstrap {recipe.suite} ({len(recipe.packages)} extra packages); "
        "progress follows")
    t0 = time.monotonic()
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    assert proc.stdout is not None
    tail: list[str] = []
    last = 0.0
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-30:]
        # debootstrap prints a line per package; show a heartbeat, not a flood.
        now = time.monotonic()
        if line.startswith(("I: Retrieving Release", "I: Validating", "I: Installing",
                            "I: Configuring", "I: Base system", "I: Extracting",
                            "W:", "E:")) and now - last > 10:
            log(f"  [{now - t0:4.0f}s] {line.strip()}")
            last = now
    if proc.wait() != 0:
        raise RuntimeError("debootstrap failed:\n" + "\n".join(tail))
    (tmp / ".gpuserve-rootfs-done").touch()
    os.replace(tmp, root)
    log(f"debootstrap done in {time.monotonic() - t0:.0f}s")
    return root


@contextmanager
def _proc_mounted(tree: Path) -> Iterator[None]:
    subprocess.run(["mount", "-t", "proc", "proc", str(tree / "proc")], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(tree / "proc")], check=False)


def _chroot(tree: Path, *cmd: str, stdin: str | None = None) -> None:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive",
           "LC_ALL": "C"}
    r = subprocess.run(["chroot", str(tree), *cmd], env=env, input=stdin, text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise RuntimeError(f"chroot {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}")


def _configure(tree: Path, recipe: Recipe, fs_uuid: str, home: Path | None,
               log: Log) -> None:
    log("configuring the guest (network, ssh keys, grub)")
    for rel, content in recipe.guest_files:
        dest = tree / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.is_symlink():
            dest.unlink()
        dest.write_bytes(content)
        os.chmod(dest, 0o644)
    for rel in recipe.remove_files:
        (tree / rel).unlink(missing_ok=True)
    (tree / "etc/fstab").write_text(
        f"UUID={fs_uuid} / ext4 errors=remount-ro 0 1\n")

    # SSH: only the lab's pinned ed25519 host key; root logs in with the lab key.
    client, hostkey = ensure_keys(home)
    for old in (tree / "etc/ssh").glob("ssh_host_*"):
        old.unlink()
    dest = tree / "etc/ssh/ssh_host_ed25519_key"
    shutil.copyfile(hostkey, dest)
    os.chmod(dest, 0o600)
    shutil.copyfile(f"{hostkey}.pub", f"{dest}.pub")
    os.chmod(f"{dest}.pub", 0o644)
    ssh_dir = tree / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(public_key(client) + "\n")
    os.chmod(ssh_dir / "authorized_keys", 0o600)

    # Each instance gets its own machine-id on first boot (systemd firstboot logic).
    (tree / "etc/machine-id").write_text("")
    (tree / "var/lib/dbus/machine-id").unlink(missing_ok=True)

    with _proc_mounted(tree):
        _chroot(tree, "systemctl", "enable", *recipe.enabled_units)
        if recipe.masked_units:
            _chroot(tree, "systemctl", "mask", *recipe.masked_units)
        # grub-pc's postinst reinstalls GRUB on upgrades to these devices.
        _chroot(tree, "debconf-set-selections",
                stdin="grub-pc grub-pc/install_devices multiselect /dev/vda\n")
        _regenerate_initramfs(tree, log)
        _install_grub_files(tree, recipe, fs_uuid)
        _chroot(tree, "apt-get", "clean")


# The first initramfs's modules (MODULES=list): what MODULES=dep picks inside the booted
# VM for its root disk (measured: `mkinitramfs` in the guest with the lab's conf.d, then
# `lsinitramfs`): virtio-pci + virtio-blk for vda, ext4 for the root filesystem, and the
# crc32c implementations ext4's metadata checksums ask for. modprobe's dependencies
# (virtio, virtio_ring, jbd2, mbcache, crc16 ...) come along by themselves.
FIRST_INITRAMFS_MODULES = ("virtio_pci", "virtio_blk", "ext4", "crc32c_generic",
                           "crc32c_intel")


def _regenerate_initramfs(tree: Path, log: Log) -> None:
    """Rebuild the initramfs with the guest's conf.d settings, but MODULES=list with the
    VM's own root-disk modules: MODULES=dep in a chroot would pick the build machine's
    modules, not the VM's, and MODULES=most put 747 modules (a 36 MB initrd, 6.3 MB
    now) in front of every boot from the image for GRUB to read, the kernel to unpack
    and udev to consider. The guest's own update-initramfs keeps MODULES=dep."""
    log("regenerating the initramfs (MODULES=list: the VM's root-disk modules)")
    kernels = sorted((tree / "boot").glob("vmlinuz-*"))
    with tempfile.TemporaryDirectory(dir=tree / "tmp") as confdir:
        conf = Path(confdir)
        shutil.copytree(tree / "etc/initramfs-tools", conf, dirs_exist_ok=True)
        for f in (conf / "conf.d").glob("*"):
            f.write_text(re.sub(r"(?m)^MODULES=.*$", "MODULES=list", f.read_text()))
        modules = conf / "modules"
        modules.write_text((modules.read_text() if modules.exists() else "")
                           + "".join(f"{m}\n" for m in FIRST_INITRAMFS_MODULES))
        inside = "/" + str(conf.relative_to(tree))
        for k in kernels:
            kver = k.name.removeprefix("vmlinuz-")
            _chroot(tree, "mkinitramfs", "-d", inside, "-o", f"/boot/initrd.img-{kver}",
                    kver)


def _install_grub_files(tree: Path, recipe: Recipe, fs_uuid: str) -> None:
    """What grub-install --target=i386-pc puts under /boot/grub, plus a first grub.cfg.

    The first grub.cfg mirrors what update-grub writes (search by fs UUID, root=UUID,
    the GRUB_CMDLINE_LINUX of /etc/default/grub); update-grub in the guest replaces it.
    It cannot run here: grub-probe inside a chroot probes the build host's disk.
    """
    src = tree / "usr/lib/grub/i386-pc"
    dst = tree / "boot/grub/i386-pc"
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix in (".mod", ".lst", ".img", ".o") or f.name == "modinfo.sh":
            shutil.copy2(f, dst / f.name)
    _chroot(tree, "grub-mkimage", "-O", "i386-pc", "-d", "/usr/lib/grub/i386-pc",
            "-o", "/boot/grub/i386-pc/core.img", "-p", "(hd0,msdos1)/boot/grub",
            "biosdisk", "part_msdos", "ext2")
    _chroot(tree, "grub-editenv", "/boot/grub/grubenv", "create")
    kernels = sorted((tree / "boot").glob("vmlinuz-*"))
    if not kernels:
        raise RuntimeError("no kernel in the rootfs (linux-image-amd64 missing?)")
    kver = kernels[-1].name.removeprefix("vmlinuz-")
    if not (tree / f"boot/initrd.img-{kver}").exists():
        raise RuntimeError(f"no initrd for kernel {kver} in the rootfs")
    cmdline = grub_cmdline(recipe)
    (tree / "boot/grub/grub.cfg").write_text(f"""\
# First-boot config written by the lab image builder; `update-grub` replaces it.
serial --unit=0 --speed=115200
terminal_input serial console
terminal_output serial console
set default=0
set timeout=1
insmod part_msdos
insmod ext2
search --no-floppy --fs-uuid --set=root {fs_uuid}
menuentry 'Debian GNU/Linux' {{
    linux /boot/vmlinuz-{kver} root=UUID={fs_uuid} ro {cmdline}
    initrd /boot/initrd.img-{kver}
}}
""")


def _make_disk(tree: Path, disk: Path, size_gib: int, fs_uuid: str, log: Log) -> None:
    log(f"writing a {size_gib} GiB partitioned disk (MBR, ext4 root, GRUB)")
    total = size_gib * 1024**3 // SECTOR
    with open(disk, "wb") as fh:
        fh.truncate(total * SECTOR)
    subprocess.run(["parted", "-s", str(disk), "mklabel", "msdos", "mkpart", "primary",
                    "ext4", f"{PART_START}s", f"{total - 1}s", "set", "1", "boot", "on"],
                   check=True, capture_output=True)
    part_kib = (total - PART_START) * SECTOR // 1024
    base = ["mkfs.ext4", "-q", "-F", "-L", "root", "-U", fs_uuid, "-b", "4096",
            "-E", f"offset={PART_START * SECTOR}", "-d", str(tree)]
    # GRUB 2.06 cannot read ext4 with orphan_file / metadata_csum_seed (e2fsprogs
    # 1.47 defaults on some distributions): keep them off where mkfs knows them.
    r = subprocess.run([*base, "-O", "^orphan_file,^metadata_csum_seed", str(disk),
                        f"{part_kib}k"], capture_output=True, text=True)
    if r.returncode != 0:
        subprocess.run([*base, str(disk), f"{part_kib}k"], check=True)
    boot = bytearray((tree / "boot/grub/i386-pc/boot.img").read_bytes())
    core = (tree / "boot/grub/i386-pc/core.img").read_bytes()
    if len(boot) != SECTOR:
        raise RuntimeError("unexpected GRUB boot.img size")
    if len(core) > (PART_START - 1) * SECTOR:
        raise RuntimeError("GRUB core.img does not fit before the first partition")
    boot[DRIVE_CHECK:DRIVE_CHECK + 2] = b"\x90\x90"
    with open(disk, "r+b") as fh:
        fh.seek(0)
        fh.write(bytes(boot[:MBR_CODE_END]))
        fh.seek(SECTOR)
        fh.write(core)


if __name__ == "__main__":
    print(ensure_image(os_name=sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OS))
