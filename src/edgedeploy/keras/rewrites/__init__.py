"""Graph rewrites of a Keras model before the tree trains it, one rewrite a module: separate ReLU layers fused
into their convolution (`relu_fusion`), SeparableConv2D split into depthwise and pointwise (`separable_split`),
kernels that feed several layers given their own output (`kernel_outputs`), Conv1D as Conv2D (`conv1d_as_2d`).
Each returns a new model with the same function; what they share, editing a functional model's config, is in
`wiring`."""

from edgedeploy.keras.rewrites.conv1d_as_2d import conv1d_as_conv2d
from edgedeploy.keras.rewrites.kernel_outputs import separate_kernel_outputs
from edgedeploy.keras.rewrites.relu_fusion import fuse_separate_relu, separate_relu_layers
from edgedeploy.keras.rewrites.separable_split import split_separable

__all__ = ["conv1d_as_conv2d", "fuse_separate_relu", "separate_kernel_outputs", "separate_relu_layers",
           "split_separable"]
