"""pyinfra's config file for the deploys run from this directory (pyinfra's CLI loads
``config.py`` from its working directory before it connects): connection failures in
one readable line with their cause and one fix (roles/base/connection.py)."""

from gpuserve.roles.base.connection import readable_connections

readable_connections()
