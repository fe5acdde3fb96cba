#!/bin/sh
# Lab stand-in for NVIDIA's start wrapper (FM user guide, "Fabric Manager Service File"):
# "--mode start" starts nv-fabricmanager (pre-NVL5 boxes: no NVLSM), "--mode stop" ends it.
case "$2" in
  start) echo "Detected Pre-NVL5 system"
         exec /usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg ;;
  stop) pid=$(cat /var/run/nvidia-fabricmanager/nv-fabricmanager.pid 2>/dev/null) \
          && kill "$pid" 2>/dev/null
        rm -f /var/run/nvidia-fabricmanager/nv-fabricmanager.pid \
          /var/run/nvidia-fabricmanager/gpuserve-lab-version
        exit 0 ;;
esac
echo "usage: $0 --mode start|stop" >&2
exit 2
