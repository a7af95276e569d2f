"""Route a request and stream its arguments with the typed client (`pip install dist/nexus_client-*.whl`).

    python examples/client_example.py "open a pull request from feature-x into main in octo/demo"
"""

from __future__ import annotations

import argparse
import json

from nexus_client import NexusClient


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("query")
    p.add_argument("--router", default="127.0.0.1:50051")
    p.add_argument("--engine", default="127.0.0.1:50053")
    args = p.parse_args()
    with NexusClient(router=args.router, engine=args.engine, timeout_s=60) as client:
        route = client.route(args.query, top_k=3)
        result = client.generate(args.query, route.tool)
    print(json.dumps({"tool": route.tool, "margin": route.margin, "candidates": [c.tool for c in route.candidates],
                      "arguments": result.arguments, "schema_valid": result.schema_valid,
                      "first_arg_token_ms": result.first_arg_token_ms}))


if __name__ == "__main__":
    main()
