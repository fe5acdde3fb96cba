"""The lab: a QEMU Debian 12 VM plus a loopback mirror standing in for a GPU host.

Product code (gpuserve/, roles/, deploy/) never imports this package; only the lab
inventory (inventory/lab.py) and the lab tests do.
"""
