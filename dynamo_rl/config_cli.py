"""``dynamo-rl config``: validate an experiment config and print it with everything resolved."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from dynamo_rl.cli import parse_config, service_parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = service_parser("config", __doc__.split(": ", 1)[1])
    parser.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    parser.add_argument("--schema", action="store_true", help="print the JSON schema instead")
    args, cfg = parse_config(parser, argv)
    if args.schema:
        print(json.dumps(type(cfg).model_json_schema(), indent=2))
        return 0
    data = cfg.model_dump(mode="json")
    if args.json:
        json.dump(data, sys.stdout, indent=2)
        print()
    else:
        import yaml

        print(yaml.safe_dump(data, sort_keys=False), end="")
    return 0
