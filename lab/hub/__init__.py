"""The lab's Hugging Face Hub stand-in (lab/hub/README.md).

``lab.hub.publish.publish(mirror_root)`` composes the repositories of ``repos.yaml``
into ``<mirror>/hub`` (a mirror publisher, lab/mirror.py); the mirror's server answers
``/hub/...`` with :func:`lab.hub.server.handle`, so a lab host's ``HF_ENDPOINT`` is
``http://10.0.2.2:<mirror port>/hub``. ``lab.hub.server.HubServer`` runs it alone.
"""

PREFIX = "/hub"
