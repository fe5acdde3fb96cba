"""gpuserve/settings.py: the one merge of host data over the roles' defaults."""

from __future__ import annotations

from gpuserve.settings import settings


def test_later_layers_win_and_host_data_wins_over_all() -> None:
    role_a = {"port": 30000, "user": "sglang"}
    role_b = {"port": 31000, "bench": "off"}
    data = {"port": 8000, "bench": "gate"}
    assert settings(data, role_a, role_b) == {"port": 8000, "user": "sglang", "bench": "gate"}
    assert settings({}, role_a, role_b) == {"port": 31000, "user": "sglang", "bench": "off"}


def test_keys_no_layer_documents_are_ignored_and_nothing_is_changed_in_place() -> None:
    """A host's data holds other deploys' keys (and the controller's): none leaks in,
    and neither the defaults nor the data are touched."""
    defaults = {"port": 30000}
    data = {"port": None, "router_api_key": "k" * 32}
    assert settings(data, defaults) == {"port": None}
    assert defaults == {"port": 30000} and data == {"port": None, "router_api_key": "k" * 32}
    assert settings(data) == {}
