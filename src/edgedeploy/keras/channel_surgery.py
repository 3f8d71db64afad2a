"""Channel surgery on a functional Keras model: which output channels can go, and the thinner model without them.

:func:`channel_groups` follows every tensor's last axis through the graph. A Conv2D or Dense layer starts a
new *group* of channels; layers that keep channels apart (batch norm, activations, pooling, dropout, padding,
a DepthwiseConv2D with depth multiplier 1, reshapes that keep the last axis, a TensorFlow operation with a
scalar such as hard-swish's ``x + 3``) pass it through; element-wise merges (Add, Multiply, ...) join the groups
of their inputs, so both branches of a residual keep the same channels, and a squeeze-and-excitation gate's last
Dense or Conv2D joins the channels it multiplies; Concatenate lays its inputs' groups side by side; Flatten into
Dense maps each channel to its rows of the Dense kernel. A group that reaches a model output, the model input, a
depthwise convolution with a depth multiplier over 1, an activation across the channels (softmax) or a layer
whose effect on channels is unknown is *held*, with the reason. :func:`thin_model` removes the channels not kept from every
held-apart group: the filters (and biases) of its Conv2D/Dense producers, the batch-norm and depthwise
vectors it passes through, and the input rows of every layer that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from edgedeploy.keras.inbound import call_refs

PRODUCERS = ("Conv2D", "Dense")  # layers whose output channels (filters, units) can be removed
PASS_THROUGH = {
    "Activation", "ReLU", "LeakyReLU", "ELU", "ThresholdedReLU", "Dropout", "SpatialDropout1D",
    "SpatialDropout2D", "GaussianNoise", "GaussianDropout", "AlphaDropout", "MaxPooling1D", "MaxPooling2D",
    "AveragePooling1D", "AveragePooling2D", "GlobalAveragePooling1D", "GlobalAveragePooling2D",
    "GlobalMaxPooling1D", "GlobalMaxPooling2D", "ZeroPadding1D", "ZeroPadding2D", "Cropping1D", "Cropping2D",
    "UpSampling1D", "UpSampling2D", "ActivityRegularization", "Masking",
}
OUTPUT = "it is a model output"  # the reason named first: every output keeps its channels
MERGES = {"Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum"}
# layers that act on each value alone, so they keep a flattened tensor's layout as well
ELEMENTWISE = {"Activation", "ReLU", "LeakyReLU", "ELU", "ThresholdedReLU", "Dropout", "GaussianNoise",
               "GaussianDropout", "AlphaDropout", "ActivityRegularization"}
# activations that normalize across the channels: removing a channel changes the others
ACROSS_CHANNELS = {"softmax", "log_softmax"}
# TensorFlow operations of a TFOpLambda layer (x + 3.0, x * (1 / 6) in hard-swish) that act on each value alone;
# with one tensor and scalar constants they pass the channels through
TF_ELEMENTWISE = {
    "__operators__.add", "__operators__.radd", "__operators__.sub", "__operators__.rsub", "__operators__.mul",
    "__operators__.rmul", "__operators__.truediv", "__operators__.neg", "math.add", "math.subtract",
    "math.multiply", "math.truediv", "math.divide", "math.maximum", "math.minimum", "math.negative", "math.abs",
    "math.sigmoid", "math.tanh", "math.exp", "math.square", "math.sqrt", "nn.relu", "nn.relu6", "nn.silu",
    "nn.swish", "nn.elu", "nn.leaky_relu", "clip_by_value", "cast", "identity",
}


@dataclass
class Group:
    """Output channels that must be kept or removed together."""

    gid: int
    size: int
    producers: list[str] = field(default_factory=list)  # Conv2D/Dense layers that write these channels
    held: list[str] = field(default_factory=list)  # why they cannot be thinned (empty: they can)

    @property
    def name(self) -> str:
        return self.producers[0] if self.producers else f"group{self.gid}"


@dataclass
class ChannelGraph:
    """What :func:`channel_groups` found: groups, and per layer the layout of its input and output channels."""

    groups: dict[int, Group]
    parent: dict[int, int]
    layouts: dict[str, Any]  # layer -> output layout: ("ch", segments) or ("flat", positions, segments)
    inputs: dict[str, list[Any]]  # layer -> layouts of its inputs
    kinds: dict[str, str]
    channelwise: set[str]  # layers with per-channel weights over their input channels (BN, depthwise, PReLU)
    consumers: dict[str, list[str]] = field(default_factory=dict)  # group name -> layers with weights reading it

    def root(self, gid: int) -> int:
        while self.parent[gid] != gid:
            gid = self.parent[gid]
        return gid

    def thinnable(self) -> dict[str, Group]:
        """Groups that can be thinned, by name (their first producer)."""
        roots = {self.root(g) for g in self.groups}
        return {self.groups[r].name: self.groups[r] for r in sorted(roots) if not self.groups[r].held}

    def held(self) -> dict[str, str]:
        """Producer layer -> why its channels cannot be thinned."""
        out = {}
        for r in sorted({self.root(g) for g in self.groups}):
            g = self.groups[r]
            reason = OUTPUT if OUTPUT in g.held else (g.held[0] if g.held else None)
            for p in g.producers:
                if reason:
                    out[p] = reason
        return out

    def group_of(self, layer: str) -> Group:
        """The group a producer layer writes."""
        return self.groups[self.root(self.layouts[layer][1][0][0])]


def _inbound(spec: dict) -> list[list[tuple[str, int, int]]]:
    """Per call of the layer, the (layer, node, tensor) triples it reads."""
    return [[(ref[0], ref[1], ref[2]) for ref in call_refs(node)] for node in spec.get("inbound_nodes") or []]


def _segments(layout) -> list[tuple[int, int]]:
    return list(layout[-1])


def _scalar_operation(kind: str, cfg: dict, spec: dict) -> bool:
    """A TFOpLambda of an element-wise TensorFlow operation on one tensor whose other operands are scalars."""
    if kind != "TFOpLambda" or cfg.get("function") not in TF_ELEMENTWISE:
        return False
    calls = _inbound(spec)
    if len(calls) != 1 or len(calls[0]) != 1:
        return False
    scalars = True

    def check(obj, top=False):
        nonlocal scalars
        if isinstance(obj, list):
            if len(obj) >= 3 and isinstance(obj[0], str) and isinstance(obj[1], int) and isinstance(obj[2], int):
                for extra in obj[3:]:
                    check(extra)
                return
            if not top:
                scalars = False  # a constant tensor (a list of values): it may differ per channel
                return
            for v in obj:
                check(v, top=True)
        elif isinstance(obj, dict):
            for key, v in obj.items():
                if key != "name":
                    check(v)
        elif not (obj is None or isinstance(obj, (bool, int, float))):
            scalars = False

    check(spec.get("inbound_nodes") or [], top=True)
    return scalars


class _Builder:
    """Builds a :class:`ChannelGraph` layer by layer (:func:`channel_groups`)."""

    def __init__(self) -> None:
        self.graph = ChannelGraph({}, {}, {}, {}, {}, set())

    def new(self, size: int, producer: str | None = None, held: str | None = None) -> tuple[str, list]:
        groups = self.graph.groups
        gid = len(groups)
        groups[gid] = Group(gid, size, [producer] if producer else [], [held] if held else [])
        self.graph.parent[gid] = gid
        return ("ch", [(gid, size)])

    def hold(self, layout, reason: str) -> None:
        for gid, _ in _segments(layout):
            self.graph.groups[self.graph.root(gid)].held.append(reason)

    def union(self, a: int, b: int) -> None:
        g = self.graph
        ra, rb = g.root(a), g.root(b)
        if ra != rb:
            g.parent[rb] = ra
            g.groups[ra].producers += g.groups[rb].producers
            g.groups[ra].held += g.groups[rb].held

    def visit(self, name: str, kind: str, cfg: dict, layer, ins: list, width: int, rank: int, scalar_op=False):
        """The layout of ``name``'s output, given its inputs' layouts ``ins``."""
        x = ins[0] if ins else None
        last_axis = cfg.get("axis") in (-1, [-1], rank - 1, [rank - 1])
        if kind == "Activation" and cfg.get("activation") in ACROSS_CHANNELS:
            reason = f"{name} ({kind} {cfg.get('activation')}) normalizes across the channels"
            self.hold(x, reason)
            return x  # the same channels, held together
        if x is not None and (kind in ELEMENTWISE or scalar_op):
            return x  # a channel (or a flattened position) keeps its place
        if kind in PRODUCERS:
            if kind == "Conv2D" and int(cfg.get("groups", 1)) != 1:
                self.hold(x, f"{name} is a grouped convolution")
                return self.new(width, name, f"{name} is a grouped convolution")
            if x is not None and x[0] == "flat" and kind != "Dense":
                self.hold(x, f"{name} ({kind}) reads a flattened tensor")
            for gid, _ in _segments(x):
                self.graph.consumers.setdefault(self.graph.groups[self.graph.root(gid)].name, []).append(name)
            return self.new(width, name)
        if x is not None and x[0] == "ch":
            if kind == "DepthwiseConv2D" and int(cfg.get("depth_multiplier", 1)) == 1 or \
                    kind == "BatchNormalization" and last_axis or kind == "PReLU" and not cfg.get("shared_axes"):
                self.graph.channelwise.add(name)
                return x
            if kind in PASS_THROUGH:
                return x
            if kind == "DepthwiseConv2D":
                reason = (f"{name} (DepthwiseConv2D) has depth_multiplier {cfg.get('depth_multiplier')}: each "
                          "input channel feeds several output channels, which are kept together with it")
                self.hold(x, reason)
                return self.new(width, held=reason)
            if kind == "Reshape" and tuple(cfg.get("target_shape", ()))[-1:] == (width,) \
                    and int(layer.input_shape[-1]) == width:
                return x  # (the Conv1D rewrite's reshapes keep the channel axis)
            if kind == "Flatten":
                positions = int(np.prod(layer.input_shape[1:-1])) if len(layer.input_shape) > 2 else 1
                return ("flat", positions, x[1])
        if kind in MERGES and all(lay[0] == "ch" for lay in ins):
            if all([s for _, s in lay[1]] == [s for _, s in ins[0][1]] for lay in ins):
                for lay in ins[1:]:
                    for (a, _), (b, _) in zip(ins[0][1], lay[1]):
                        self.union(a, b)
                return ins[0]
            reason = f"{name} ({kind}) merges tensors laid out differently"
        elif kind == "Concatenate" and all(lay[0] == "ch" for lay in ins) and last_axis:
            return ("ch", [seg for lay in ins for seg in lay[1]])
        else:
            reason = f"{name} ({kind}) has an unknown effect on channels"
        for lay in ins:
            self.hold(lay, reason)
        return self.new(width, held=reason)


def channel_groups(model) -> ChannelGraph:
    """The channel groups of a functional tf_keras model (see the module's docstring)."""
    config = model.get_config()
    build = _Builder()
    graph = build.graph
    for spec in config["layers"]:
        name, kind, cfg = spec["name"], spec["class_name"], spec.get("config", {})
        graph.kinds[name] = kind
        layer = model.get_layer(name)
        calls = _inbound(spec)
        out_shape = layer.output_shape if not isinstance(layer.output_shape, list) else layer.output_shape[0]
        width = int(out_shape[-1]) if out_shape and out_shape[-1] is not None else 0
        if kind == "InputLayer":
            graph.layouts[name] = build.new(width, held="the model's input")
            continue
        ins = [graph.layouts[src] for src, _, _ in calls[0]] if calls else []
        graph.inputs[name] = ins
        if len(calls) > 1:
            reason = f"{name} ({kind}) is called more than once"
            for lay in ins:
                build.hold(lay, reason)
            graph.layouts[name] = build.new(width, name if kind in PRODUCERS else None, reason)
            continue
        graph.layouts[name] = build.visit(name, kind, cfg, layer, ins, width, len(out_shape),
                                          _scalar_operation(kind, cfg, spec))
    for out in config["output_layers"]:
        names = [out[0]] if isinstance(out[0], str) else [o[0] for o in out]
        for n in names:
            build.hold(graph.layouts[n], OUTPUT)
    # consumers were filed under their group's name when read; file them under the group it was joined to
    merged: dict[str, list[str]] = {}
    first = {g.producers[0]: g.gid for g in graph.groups.values() if g.producers}
    for gname, layers in graph.consumers.items():
        key = graph.groups[graph.root(first[gname])].name if gname in first else gname
        merged.setdefault(key, []).extend(layers)
    graph.consumers = merged
    return graph


def _index(graph: ChannelGraph, layout, keep: Mapping[int, np.ndarray]) -> np.ndarray:
    """Positions of the kept channels in a tensor with ``layout`` (root group id -> kept indices)."""
    parts, offset = [], 0
    for gid, size in _segments(layout):
        kept = keep.get(graph.root(gid))
        parts.append(offset + (np.arange(size) if kept is None else np.asarray(kept)))
        offset += size
    idx = np.concatenate(parts) if parts else np.arange(0)
    if layout[0] == "flat":  # Flatten is row-major over (positions, channels)
        idx = np.concatenate([p * offset + idx for p in range(layout[1])])
    return idx


def thin_model(model, graph: ChannelGraph, keep: Mapping[str, Any]):
    """The model with only the channels in ``keep`` (group name -> indices kept) of each named group.

    A group not named keeps all its channels; naming a held group is an error of the caller (ValueError)."""
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    by_root = keep_by_root(graph, keep)
    config = model.get_config()
    for spec in config["layers"]:
        name = spec["name"]
        if graph.kinds[name] in PRODUCERS and name in graph.layouts and graph.layouts[name][0] == "ch":
            root = graph.root(graph.layouts[name][1][0][0])
            if root in by_root:
                spec["config"]["filters" if graph.kinds[name] == "Conv2D" else "units"] = int(len(by_root[root]))
        elif graph.kinds[name] == "Reshape" and graph.layouts.get(name, ("",))[0] == "ch":
            # a reshape that keeps the channel axis (a squeeze-and-excitation gate to (1, 1, C)) keeps the kept ones
            target = list(spec["config"]["target_shape"])
            spec["config"]["target_shape"] = [*target[:-1], int(len(_index(graph, graph.layouts[name], by_root)))]
    new = keras.Model.from_config(config)
    for layer in new.layers:
        weights = model.get_layer(layer.name).get_weights()
        if weights:
            layer.set_weights(_sliced(graph, layer.name, weights, by_root))
    return new


def keep_by_root(graph: ChannelGraph, keep: Mapping[str, Any]) -> dict[int, np.ndarray]:
    """``keep`` (group name -> kept indices) checked and keyed by the group's root id."""
    groups = graph.thinnable()
    by_root: dict[int, np.ndarray] = {}
    for gname, kept in keep.items():
        if gname not in groups:
            raise ValueError(f"{gname} cannot be thinned: {graph.held().get(gname, 'no such group')}")
        kept = np.sort(np.asarray(kept, dtype=np.int64))
        if len(kept) < 1 or len(np.unique(kept)) != len(kept) or kept.max() >= groups[gname].size:
            raise ValueError(f"{gname}: kept channels must be distinct indices below {groups[gname].size}")
        by_root[groups[gname].gid] = kept
    return by_root


def layout_index(graph: ChannelGraph, layout, keep: Mapping[int, np.ndarray]) -> np.ndarray:
    """Positions of the kept channels (root id -> indices) in a tensor laid out as ``layout``."""
    return _index(graph, layout, keep)


def layout_rows(graph: ChannelGraph, layout) -> list[tuple[str | None, int]]:
    """Per channel of a tensor laid out as ``layout``: (thinnable group name or None, index in the group)."""
    names = {g.gid: n for n, g in graph.thinnable().items()}
    rows = []
    for gid, size in _segments(layout):
        rows += [(names.get(graph.root(gid)), i) for i in range(size)]
    return rows


def _sliced(graph: ChannelGraph, name: str, weights: list[np.ndarray], keep: Mapping[int, np.ndarray]):
    kind = graph.kinds[name]
    if kind in PRODUCERS and graph.layouts[name][0] == "ch":
        out_idx = _index(graph, graph.layouts[name], keep)
        in_idx = _index(graph, graph.inputs[name][0], keep)
        kernel = weights[0]
        in_axis = kernel.ndim - 2
        kernel = np.take(np.take(kernel, in_idx, axis=in_axis), out_idx, axis=kernel.ndim - 1)
        return [kernel] + [np.take(w, out_idx, axis=-1) for w in weights[1:]]
    if name in graph.channelwise:
        idx = _index(graph, graph.inputs[name][0], keep)
        if kind == "DepthwiseConv2D":
            return [np.take(weights[0], idx, axis=2)] + [np.take(w, idx, axis=-1) for w in weights[1:]]
        return [np.take(w, idx, axis=-1) for w in weights]
    return weights


def kernel_channels(model) -> dict[str, tuple[int, int]]:
    """(input channels, output channels) of every Conv2D/DepthwiseConv2D/Dense kernel, by layer (wrappers
    unwrapped): what a thinned model and all its descendants must keep."""
    from edgedeploy.keras.model import base_name, inner, kernel_of

    out = {}
    for layer in model.layers:
        kind = inner(layer).__class__.__name__
        if kind in ("Conv2D", "DepthwiseConv2D", "Dense"):
            kernel = kernel_of(layer)
            if kernel is not None:
                cin = kernel.shape[-2]
                cout = kernel.shape[-1] * (cin if kind == "DepthwiseConv2D" else 1)
                out[base_name(layer.name)] = (int(cin), int(cout))
    return out
