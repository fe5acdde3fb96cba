"""Read SGLang's ``/metrics`` of several workers at once, as one JSON line.

    python3 -c "$(this file)" http://10.0.0.2:30000 http://10.0.0.3:30000

Run by a rolling switch's live judgement (roles/router/live.py) on the router host,
which reaches every worker URL of its gateway's manifest. Passed with ``python3 -c``
rather than installed, so it runs on a router host deployed by any earlier version.
SGLang's API-key middleware exempts ``/metrics`` (``srt/utils/auth.py``), so no key is
sent. Keeps only the series the judgement reads (requests, aborted requests, generated
tokens, TTFT and ITL buckets); each answer is bounded in time and size. Prints
``{"reads": [{"url", "text", "error"}]}``; always exits 0.
"""

import json
import sys
import urllib.request

KEEP = ("sglang:num_requests_total", "sglang:num_aborted_requests_total",
        "sglang:generation_tokens_total", "sglang:time_to_first_token_seconds_bucket",
        "sglang:inter_token_latency_seconds_bucket")
LIMIT = 16 * 1024 * 1024  # bytes read of one answer
TIMEOUT = 10.0


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # noqa: ARG002 - the handler's signature
        return None


def read(url):
    """The kept lines of ``url``/metrics, or an error text."""
    opener = urllib.request.build_opener(_NoRedirect)
    target = url.rstrip("/") + "/metrics"
    try:
        with opener.open(target, timeout=TIMEOUT) as resp:
            body = resp.read(LIMIT + 1)
    except Exception as exc:  # noqa: BLE001 - reported to the controller, never raised
        return None, f"GET {target}: {type(exc).__name__}: {str(exc)[:200]}"
    if len(body) > LIMIT:
        return None, f"GET {target}: answer above {LIMIT} bytes"
    lines = [line for line in body.decode("utf-8", "replace").splitlines()
             if line.startswith(KEEP)]
    return "\n".join(lines) + "\n", None


def main():
    reads = []
    for url in sys.argv[1:]:
        if not url.startswith(("http://", "https://")):
            reads.append({"url": url, "text": None, "error": "not an http(s) URL"})
            continue
        text, error = read(url)
        reads.append({"url": url, "text": text, "error": error})
    print(json.dumps({"reads": reads}))


if __name__ == "__main__":
    main()
