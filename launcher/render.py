"""Print structured results as text, JSON or YAML."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from launcher.wording import plural

FORMATS = ("text", "json", "yaml")


def dump(data: Any, fmt: str, out: TextIO = sys.stdout) -> None:
    if fmt == "json":
        json.dump(data, out, indent=2, ensure_ascii=False)
        out.write("\n")
    else:
        out.write(to_yaml(data))


def to_yaml(data: Any) -> str:
    import yaml

    class Dumper(yaml.SafeDumper):
        """Text of several lines (a batch script) as a literal block, as it reads, not as one quoted line."""

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        block = "\n" in value and all(line == line.rstrip() for line in value.splitlines())
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if block else None)

    Dumper.add_representer(str, text)
    return yaml.dump(data, Dumper=Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False, width=100)


def dryrun_text(data: dict[str, Any], out: TextIO = sys.stdout) -> None:
    """The human form of a dry run: each request, then each node's command and env."""
    nodes = data["nodes"]
    out.write(f"Dry run (nothing was sent): backend {data['backend']}, run id {data['run_id']}, "
              f"{plural(len(nodes), 'node')}, work dir {data['work_dir']}\n")
    for note in data["notes"]:
        out.write(f"note: {note}\n")
    if data.get("overrides"):
        out.write(f"overrides: {' '.join(data['overrides'])}\n--- effective spec\n{to_yaml(data['effective_spec'])}")
    build = data["image_build"]
    if build:
        out.write(f"image build (`launcher build`): docker build -f {build['dockerfile']} -t {build['tag']} "
                  f"{' '.join(f'--build-arg {k}={v}' for k, v in build['build_args'].items())} {build['context']}\n")
    for index, request in enumerate(data["requests"], 1):
        out.write(f"\n--- request {index}/{len(data['requests'])}: {request['operation']} ({request['target']})\n")
        out.write(to_yaml(request["body"]))
    for node in nodes:
        out.write(f"\n--- node {node['name']}" + (f"  image {node['image']}" if node["image"] else "") + "\n")
        out.write(f"command: {json.dumps(node['command'])}\nenv:\n")
        for name, value in node["env"].items():
            out.write(f"  {name}={json.dumps(value, ensure_ascii=False) if _needs_quotes(value) else value}\n")


def _needs_quotes(value: str) -> bool:
    return value == "" or any(c.isspace() or c in "\"'\\$`" for c in value) or not value.isprintable()
