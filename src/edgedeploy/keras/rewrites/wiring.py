"""What the graph rewrites share: edits of a functional model's config that drop layers or make consumers read
another layer."""

from __future__ import annotations

from typing import Iterable


def bypass_layers(config: dict, rename: dict[str, str]) -> dict:
    """Drop the layers named in ``rename`` from a functional model's config; their consumers read
    ``rename[name]`` (the layer before them) instead."""
    config["layers"] = [spec for spec in config["layers"] if spec["name"] not in rename]
    return redirect_consumers(config, rename)


def redirect_consumers(config: dict, rename: dict[str, str], keep: Iterable[str] = ()) -> dict:
    """In a functional model's config, every layer (but those in ``keep``) and the model's inputs and outputs
    read ``rename[name]`` where they read ``name``."""
    keep = set(keep)

    def fix(obj):
        if isinstance(obj, list):
            if len(obj) >= 3 and isinstance(obj[0], str) and obj[0] in rename and isinstance(obj[1], int):
                return [rename[obj[0]], *obj[1:]]
            return [fix(v) for v in obj]
        if isinstance(obj, dict):
            return {k: fix(v) for k, v in obj.items()}
        return obj

    for spec in config["layers"]:
        if spec["name"] not in keep:
            spec["inbound_nodes"] = fix(spec["inbound_nodes"])
    config["output_layers"] = fix(config["output_layers"])
    config["input_layers"] = fix(config["input_layers"])
    return config
