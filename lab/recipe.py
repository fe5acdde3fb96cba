"""The image recipes (lab/recipe.yaml for Debian 12, lab/recipe-<os>.yaml for the other
operating systems, + the files under lab/guest/) and their hash.

The cached image is named by the hash of everything that goes into it, so a changed
package list, guest file, key or build step rebuilds it and nothing else does. Bump
BUILD_VERSION when image.py changes what it produces from the same inputs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

LAB_DIR = Path(__file__).resolve().parent
RECIPE_FILE = LAB_DIR / "recipe.yaml"
GUEST_DIR = LAB_DIR / "guest"
DEFAULT_OS = "debian12"
# The operating systems a lab host can run: each its own recipe and cached image
# (named <os>-<hash>.raw). Debian 12 keeps the recipe file it always had.
OS_RECIPES = {"debian12": RECIPE_FILE, "debian13": LAB_DIR / "recipe-debian13.yaml"}

# Bump when image.py's output changes for the same recipe (stage 2: configure + disk).
BUILD_VERSION = 3
# Bump when the debootstrap invocation changes for the same recipe (stage 1).
ROOTFS_VERSION = 1

_REQUIRED = {"suite": str, "mirror": str, "variant": str, "packages": list,
             "disk_size_gib": int, "masked_units": list, "enabled_units": list}
# guest_overlay: a directory under lab/ whose files are laid over lab/guest/ (same path
# wins); remove_files: paths the image must not have (left out of lab/guest/'s files and
# removed from the debootstrap tree, e.g. the one-line sources.list on a deb822 system)
_OPTIONAL = {"guest_overlay": str, "remove_files": list}


@dataclass(frozen=True)
class Recipe:
    suite: str
    mirror: str
    variant: str
    packages: tuple[str, ...]
    disk_size_gib: int
    masked_units: tuple[str, ...]
    enabled_units: tuple[str, ...]
    guest_files: tuple[tuple[str, bytes], ...]  # (path relative to /, content)
    remove_files: tuple[str, ...] = ()

    def rootfs_hash(self) -> str:
        """Hash of the debootstrap stage only (the slow, network-bound part)."""
        doc = {"v": ROOTFS_VERSION, "suite": self.suite, "mirror": self.mirror,
               "variant": self.variant, "packages": sorted(self.packages)}
        return _sha(json.dumps(doc, sort_keys=True).encode())

    def image_hash(self, authorized_key: str, host_pub: str) -> str:
        """Hash of the whole image: rootfs, guest files, keys and build version."""
        h = hashlib.sha256()
        doc = {"v": BUILD_VERSION, "rootfs": self.rootfs_hash(),
               "disk_size_gib": self.disk_size_gib,
               "masked": list(self.masked_units), "enabled": list(self.enabled_units),
               "authorized_key": authorized_key.strip(), "host_pub": host_pub.strip()}
        if self.remove_files:  # only where set: Debian 12's hash stays what it was
            doc["remove"] = sorted(self.remove_files)
        h.update(json.dumps(doc, sort_keys=True).encode())
        for rel, content in self.guest_files:
            h.update(b"\0file\0" + rel.encode() + b"\0" + _sha(content).encode())
        return h.hexdigest()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def recipe_file_for(os_name: str) -> Path:
    """The recipe of lab OS ``os_name``; an unknown name is refused, naming the known."""
    if os_name not in OS_RECIPES:
        raise ValueError(f"--os {os_name!r}: the lab builds {', '.join(OS_RECIPES)}")
    return OS_RECIPES[os_name]


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def load_recipe(recipe_file: Path = RECIPE_FILE, guest_dir: Path = GUEST_DIR) -> Recipe:
    """Load and check the recipe; a bad recipe is a lab bug, so errors name the key."""
    data = yaml.safe_load(recipe_file.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{recipe_file}: expected a mapping")
    for key, typ in _REQUIRED.items():
        if not isinstance(data.get(key), typ):
            raise ValueError(f"{recipe_file}: {key}: expected {typ.__name__}")
    for key, typ in _OPTIONAL.items():
        if key in data and not isinstance(data[key], typ):
            raise ValueError(f"{recipe_file}: {key}: expected {typ.__name__}")
    unknown = set(data) - set(_REQUIRED) - set(_OPTIONAL)
    if unknown:
        raise ValueError(f"{recipe_file}: unknown keys {sorted(unknown)}")
    files = _files(guest_dir)
    if "guest_overlay" in data:
        files.update(_files(recipe_file.parent / data["guest_overlay"]))
    removed = tuple(str(r) for r in data.get("remove_files", ()))
    for rel in removed:
        files.pop(rel, None)
    return Recipe(
        suite=data["suite"], mirror=data["mirror"], variant=data["variant"],
        packages=tuple(data["packages"]), disk_size_gib=data["disk_size_gib"],
        masked_units=tuple(data["masked_units"]), enabled_units=tuple(data["enabled_units"]),
        guest_files=tuple(sorted(files.items())), remove_files=removed,
    )


def grub_cmdline(recipe: Recipe) -> str:
    """The kernel command line update-grub would generate from the guest's
    /etc/default/grub (GRUB_CMDLINE_LINUX then GRUB_CMDLINE_LINUX_DEFAULT, as
    grub-mkconfig's 10_linux does for the default entry), so the builder's first
    grub.cfg and every later update-grub agree."""
    for rel, content in recipe.guest_files:
        if rel == "etc/default/grub":
            values = {}
            for line in content.decode().splitlines():
                key, sep, val = line.partition("=")
                if sep and key in ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT"):
                    values[key] = val.strip().strip('"')
            if "GRUB_CMDLINE_LINUX" not in values:
                break
            parts = (values["GRUB_CMDLINE_LINUX"], values.get("GRUB_CMDLINE_LINUX_DEFAULT", ""))
            return " ".join(p for p in parts if p)
    raise ValueError("lab/guest/etc/default/grub has no GRUB_CMDLINE_LINUX")
