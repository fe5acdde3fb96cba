"""The image recipe hash changes exactly when something that goes into the image does."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lab.recipe import GUEST_DIR, RECIPE_FILE, grub_cmdline, load_recipe


@pytest.fixture
def recipe_copy(tmp_path: Path) -> tuple[Path, Path]:
    rfile = tmp_path / "recipe.yaml"
    shutil.copy(RECIPE_FILE, rfile)
    gdir = tmp_path / "guest"
    shutil.copytree(GUEST_DIR, gdir)
    return rfile, gdir


def _hash(rfile: Path, gdir: Path, client: str = "ssh-ed25519 AAAAclient",
          host: str = "ssh-ed25519 AAAAhost") -> str:
    return load_recipe(rfile, gdir).image_hash(client, host)


def test_hash_is_stable_for_the_same_inputs(recipe_copy):
    assert _hash(*recipe_copy) == _hash(*recipe_copy)
    assert _hash(*recipe_copy) == load_recipe().image_hash("ssh-ed25519 AAAAclient",
                                                           "ssh-ed25519 AAAAhost")


def test_package_change_changes_both_stage_hashes(recipe_copy):
    rfile, gdir = recipe_copy
    before = load_recipe(rfile, gdir)
    rfile.write_text(rfile.read_text().replace("  - less\n", "  - less\n  - jq\n"))
    after = load_recipe(rfile, gdir)
    assert "jq" in after.packages
    assert after.rootfs_hash() != before.rootfs_hash()
    assert _hash(rfile, gdir) != before.image_hash("ssh-ed25519 AAAAclient",
                                                   "ssh-ed25519 AAAAhost")


def test_package_order_does_not_matter_to_debootstrap_stage(recipe_copy):
    rfile, gdir = recipe_copy
    before = load_recipe(rfile, gdir).rootfs_hash()
    text = rfile.read_text()
    rfile.write_text(text.replace("  - systemd\n  - systemd-sysv\n",
                                  "  - systemd-sysv\n  - systemd\n"))
    assert load_recipe(rfile, gdir).rootfs_hash() == before


def test_guest_file_change_rebuilds_image_but_not_rootfs(recipe_copy):
    rfile, gdir = recipe_copy
    before = load_recipe(rfile, gdir)
    net = gdir / "etc/systemd/network/10-lab.network"
    net.write_text(net.read_text() + "# changed\n")
    after = load_recipe(rfile, gdir)
    assert after.rootfs_hash() == before.rootfs_hash()
    assert _hash(rfile, gdir) != before.image_hash("ssh-ed25519 AAAAclient",
                                                   "ssh-ed25519 AAAAhost")


def test_new_guest_file_and_keys_change_the_hash(recipe_copy):
    rfile, gdir = recipe_copy
    base = _hash(rfile, gdir)
    assert _hash(rfile, gdir, host="ssh-ed25519 AAAAother") != base
    assert _hash(rfile, gdir, client="ssh-ed25519 AAAAother") != base
    (gdir / "etc/motd").write_text("hello\n")
    assert _hash(rfile, gdir) != base


def test_unknown_or_missing_keys_are_refused(recipe_copy):
    rfile, gdir = recipe_copy
    rfile.write_text(rfile.read_text() + "bogus: 1\n")
    with pytest.raises(ValueError, match="unknown keys"):
        load_recipe(rfile, gdir)
    rfile.write_text("suite: bookworm\n")
    with pytest.raises(ValueError, match="mirror"):
        load_recipe(rfile, gdir)


def test_first_boot_cmdline_matches_update_grub_and_keeps_iommu_off():
    line = grub_cmdline(load_recipe())
    assert line.split() == ["console=tty0", "console=ttyS0,115200n8", "intel_iommu=off"]
    assert "intel_iommu=on" not in line


def test_grub_cmdline_concatenates_linux_then_default(recipe_copy):
    rfile, gdir = recipe_copy
    (gdir / "etc/default/grub").write_text(
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX="console=ttyS0"\n')
    assert grub_cmdline(load_recipe(rfile, gdir)) == "console=ttyS0 quiet"
    (gdir / "etc/default/grub").write_text('GRUB_TIMEOUT=1\n')
    with pytest.raises(ValueError, match="GRUB_CMDLINE_LINUX"):
        grub_cmdline(load_recipe(rfile, gdir))


def test_debian13_recipe_is_trixie_with_deb822_sources_only():
    from lab.recipe import OS_RECIPES, recipe_file_for

    d12, d13 = load_recipe(), load_recipe(recipe_file_for("debian13"))
    assert (d12.suite, d13.suite) == ("bookworm", "trixie")
    files = dict(d13.guest_files)
    assert "etc/apt/sources.list" not in files and d13.remove_files == ("etc/apt/sources.list",)
    sources = files["etc/apt/sources.list.d/debian.sources"].decode()
    assert "Suites: trixie trixie-updates" in sources and "Types: deb" in sources
    assert set(d13.packages) == set(d12.packages)
    assert d13.rootfs_hash() != d12.rootfs_hash()
    assert set(OS_RECIPES) == {"debian12", "debian13"}
    with pytest.raises(ValueError, match="debian12, debian13"):
        recipe_file_for("ubuntu2204")
