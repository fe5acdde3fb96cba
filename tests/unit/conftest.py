"""Shared by the unit tier: pytest puts this directory on sys.path (its "prepend"
import mode, for a conftest.py outside any package), so every unit test module can
``import systemd_words``."""
