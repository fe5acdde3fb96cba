"""``python -m sglang.launch_server ARGS``: the stand-in server (see sglang._standin.main)."""

import sys
import warnings

from sglang._standin.main import run

if __name__ == "__main__":
    # The real module warns the same way (sglang/launch_server.py, 0.5.23).
    warnings.warn(
        "'python -m sglang.launch_server' is still supported, but "
        "'sglang serve' is the recommended entrypoint.\n"
        "  Example: sglang serve --model-path <model> [options]",
        UserWarning,
        stacklevel=1,
    )
    run(sys.argv[1:])
