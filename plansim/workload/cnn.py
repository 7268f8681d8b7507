"""A ResNet with bottleneck blocks (He et al. 2016), ResNet-50 by default, as torchvision builds it ("v1.5":
the stride-2 convolution of a downsampling block is its 3x3, not its first 1x1).

Stem (layer -1): 7x7/2 convolution to ``hidden`` channels, BatchNorm, ReLU, 3x3/2 max-pool. Stage ``i`` has
``stage_blocks[i]`` bottlenecks of width ``w = hidden * 2**i`` (1x1 to ``w``, 3x3, 1x1 to ``4w``, each with
BatchNorm; ReLU after the first two and after the residual add); the first block of a stage downsamples (stride 2
from stage 2 on) with a 1x1 projection shortcut. Head (layer ``layers``): global average pool, fully connected
layer to ``vocab`` classes, cross-entropy.

FLOPs are FLOPs, not multiply-accumulates: a convolution is ``2 * out_elements * c_in * k^2`` (ResNet-50 at
224x224 is about 4.1 G multiply-accumulates, so about 8.2 GFLOPs forward per image). Convolutions have no bias;
BatchNorm has a scale and a shift per channel. Tensor parallelism is not supported (``tp`` must be 1).

Saved activations: each convolution, BatchNorm and the fc layer keep their input, ReLU its output, max-pool its
input and int64 indices, the loss its fp32 softmax.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import networkx as nx

from plansim.errors import PlansimError
from plansim.workload.graph import IN, PREV, Attrs, Node, Sharding, gemm, op, pointwise, stamp
from plansim.workload.shape import ModelShape

__all__ = ["Bottleneck", "add_cnn", "bottlenecks", "resnet_parameters"]


BATCHNORM_FLOPS = 7  # training mode: mean, centre, square, variance sum, normalise, scale, shift
RELU_FLOPS = 1
POOL_WINDOW = 9  # 3x3 max-pool: comparisons per output element
LOSS_FLOPS = 5
EXPANSION = 4  # bottleneck output channels over its width (He et al. 2016, Table 1)


@dataclass(frozen=True)
class Bottleneck:
    """One bottleneck block: input channels, width, stride of its 3x3, input height (= width) in pixels."""

    c_in: int
    width: int
    stride: int
    size: int

    @property
    def c_out(self) -> int:
        """Output channels, ``4 * width``."""
        return EXPANSION * self.width

    @property
    def downsample(self) -> bool:
        """Whether the shortcut is a strided 1x1 projection rather than the identity."""
        return self.stride != 1 or self.c_in != self.c_out


def _out_size(size: int, kernel: int, stride: int) -> int:
    """Output size of a convolution or pool padded by ``kernel // 2``."""
    return (size + 2 * (kernel // 2) - kernel) // stride + 1


def bottlenecks(spec: ModelShape) -> Iterator[Bottleneck]:
    """The bottleneck blocks of ``spec`` in order, with their input sizes (the stem divides the image by 4)."""
    c_in, size = spec.hidden, _out_size(_out_size(spec.image_size, 7, 2), 3, 2)
    for stage, blocks in enumerate(spec.stage_blocks):
        width = spec.hidden * 2**stage
        for i in range(blocks):
            block = Bottleneck(c_in, width, 2 if (i == 0 and stage > 0) else 1, size)
            yield block
            c_in, size = block.c_out, _out_size(size, 3, block.stride)


def _final_channels(spec: ModelShape) -> int:
    return EXPANSION * spec.hidden * 2 ** (len(spec.stage_blocks) - 1)


def resnet_parameters(spec: ModelShape) -> int:
    """Trainable parameters: convolution weights, BatchNorm scale and shift, fc weight and bias.

    >>> from plansim.workload import load_model
    >>> resnet_parameters(load_model("resnet50"))
    25557032
    """
    total = 3 * spec.hidden * 7 * 7 + 2 * spec.hidden  # stem conv + BN
    for blk in bottlenecks(spec):
        w = blk.width
        total += blk.c_in * w + 9 * w * w + w * blk.c_out + 2 * (w + w + blk.c_out)
        if blk.downsample:
            total += blk.c_in * blk.c_out + 2 * blk.c_out
    return total + _final_channels(spec) * spec.vocab + spec.vocab


def _conv(b: int, c_in: int, c_out: int, kernel: int, stride: int, size: int, E: int) -> Attrs:
    out = _out_size(size, kernel, stride)
    x, y, w = b * c_in * size * size, b * c_out * out * out, c_in * c_out * kernel * kernel
    return op("conv", flops=2 * y * c_in * kernel * kernel, nbytes=E * (x + w + y), saved=E * x, params=w)


def _bn(elements: int, channels: int, E: int) -> Attrs:
    return pointwise(
        "norm", elements, BATCHNORM_FLOPS, E, extra_bytes=2 * E * channels, saved=E * elements, params=2 * channels
    )


def _relu(elements: int, E: int) -> Attrs:
    return pointwise("elementwise", elements, RELU_FLOPS, E, saved=E * elements)


def _block_nodes(blk: Bottleneck, b: int, E: int) -> list[Node]:
    w, out = blk.width, _out_size(blk.size, 3, blk.stride)
    mid_in, mid_out, y = b * w * blk.size**2, b * w * out * out, b * blk.c_out * out * out
    nodes = [
        Node("conv1", _conv(b, blk.c_in, w, 1, 1, blk.size, E)),
        Node("bn1", _bn(mid_in, w, E)),
        Node("relu1", _relu(mid_in, E)),
        Node("conv2", _conv(b, w, w, 3, blk.stride, blk.size, E)),
        Node("bn2", _bn(mid_out, w, E)),
        Node("relu2", _relu(mid_out, E)),
        Node("conv3", _conv(b, w, blk.c_out, 1, 1, out, E)),
        Node("bn3", _bn(y, blk.c_out, E)),
    ]
    shortcut = IN
    if blk.downsample:
        down = _conv(b, blk.c_in, blk.c_out, 1, blk.stride, blk.size, E)
        nodes += [Node("down", down, (IN,)), Node("down_bn", _bn(y, blk.c_out, E))]
        shortcut = "down_bn"
    add = pointwise("elementwise", y, 1, E, reads=2)
    return [*nodes, Node("add", add, ("bn3", shortcut)), Node("relu3", _relu(y, E), (PREV,))]


def _stem(spec: ModelShape, b: int, E: int) -> list[Node]:
    c, conv_out = spec.hidden, _out_size(spec.image_size, 7, 2)
    y = b * c * conv_out**2
    pooled = b * c * _out_size(conv_out, 3, 2) ** 2
    pool = pointwise("pool", pooled, POOL_WINDOW, E, extra_bytes=E * (y - pooled), saved=E * y + 8 * pooled)
    return [
        Node("conv", _conv(b, 3, c, 7, 2, spec.image_size, E)),
        Node("bn", _bn(y, c, E)),
        Node("relu", _relu(y, E)),
        Node("maxpool", pool),
    ]


def _head(spec: ModelShape, size: int, b: int, E: int) -> list[Node]:
    c, v = _final_channels(spec), spec.vocab
    x = b * c * size * size
    avgpool = op("pool", flops=x, nbytes=E * (x + b * c))
    loss = op("loss", flops=LOSS_FLOPS * b * v, nbytes=(E + 4) * b * v, saved=4 * b * v)
    return [Node("avgpool", avgpool), Node("fc", gemm(b, v, c, E, bias=v, saved=E * b * c)), Node("loss", loss)]


def add_cnn(graph: nx.DiGraph, spec: ModelShape, sh: Sharding) -> int:
    """Add a ResNet's ops to ``graph``; return the bytes of the largest block input (an upper bound per block)."""
    if sh.tp != 1:
        raise PlansimError(f"cnn models support tp=1 only: use dp or pp (got tp={sh.tp})")
    b, E = sh.micro_batch, sh.act_bytes
    last = stamp(graph, _stem(spec, b, E), -1, "in.", None)
    largest, size = 0, 0
    for layer, blk in enumerate(bottlenecks(spec)):
        last = stamp(graph, _block_nodes(blk, b, E), layer, f"L{layer}.", last)
        largest = max(largest, E * b * blk.c_in * blk.size**2)
        size = _out_size(blk.size, 3, blk.stride)
    stamp(graph, _head(spec, size, b, E), spec.layers, "out.", last)
    return largest
