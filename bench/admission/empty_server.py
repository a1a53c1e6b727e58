"""The baseline: an aiohttp HTTPS handler that only parses the review and allows it.

Run as ``python -m bench.admission.empty_server --port P --cert C --key K``.
"""

import argparse
import json
import ssl

from aiohttp import web


async def _allow(request: web.Request) -> web.Response:
    review = json.loads(await request.read())
    uid = review["request"]["uid"]
    answer = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": True},
    }
    return web.json_response(answer)


async def _ready(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(args.cert, args.key)
    app = web.Application()
    app.router.add_post("/mutate", _allow)
    app.router.add_get("/readyz", _ready)
    web.run_app(app, host="127.0.0.1", port=args.port, ssl_context=context, print=None)


if __name__ == "__main__":
    main()
