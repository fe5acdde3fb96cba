"""Shared by the unit tier: pytest puts this directory on sys.path (its "prepend"
import mode, for a conftest.py outside any package), so every unit test module can
``import systemd_words``."""

# pyinfra's CLI package monkey-patches the whole process with gevent when it is first
# imported (pyinfra_cli/__init__.py: monkey.patch_all()), as every pyinfra run does
# first thing. Unit tests that load inventories in-process (gpuserve check) import it;
# done later, after another test has started threads (the Hub stand-in's servers), the
# patch breaks the import lock ("cannot release un-acquired lock"). So the unit tier is
# patched here, before its test modules are imported: every unit test runs as pyinfra
# runs, whatever the order.
import pyinfra_cli  # noqa: E402, F401  (the patch is the point)
