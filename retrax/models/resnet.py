"""ResNet-50 and Wide ResNet (image classifiers on NHWC images)."""

from retrax import layers as tl
from retrax.models import registry


def ConvBlock(kernel_size, filters, strides, norm, non_linearity,
              mode='train'):
  """ResNet bottleneck block with a strided 1x1 convolution shortcut.

  Main path: 1x1 conv (strided), `ks x ks` conv ('SAME'), 1x1 conv, each
  followed by `norm` (and `non_linearity` but for the last); shortcut: a
  strided 1x1 conv and `norm`; the sum goes through `non_linearity`.
  """
  ks = kernel_size
  filters1, filters2, filters3 = filters
  main = [
      tl.Conv(filters1, (1, 1), strides),
      norm(mode=mode),
      non_linearity(),
      tl.Conv(filters2, (ks, ks), padding='SAME'),
      norm(mode=mode),
      non_linearity(),
      tl.Conv(filters3, (1, 1)),
      norm(mode=mode),
  ]
  shortcut = [
      tl.Conv(filters3, (1, 1), strides),
      norm(mode=mode),
  ]
  return [tl.Residual(main, shortcut=shortcut), non_linearity()]


def IdentityBlock(kernel_size, filters, norm, non_linearity, mode='train'):
  """ResNet bottleneck block with an identity shortcut (same input/output size)."""
  ks = kernel_size
  filters1, filters2, filters3 = filters
  main = [
      tl.Conv(filters1, (1, 1)),
      norm(mode=mode),
      non_linearity(),
      tl.Conv(filters2, (ks, ks), padding='SAME'),
      norm(mode=mode),
      non_linearity(),
      tl.Conv(filters3, (1, 1)),
      norm(mode=mode),
  ]
  return [tl.Residual(main), non_linearity()]


@registry.register
def Resnet50(d_hidden=64, n_output_classes=1001, mode='train',
             norm=tl.BatchNorm, non_linearity=tl.Relu):
  """ResNet-50 (https://arxiv.org/abs/1512.03385) mapping images to logits.

  Inputs `(batch, h, w, c)` (cast to float); the network divides h and w by
  32 before a 7x7 average pool, so 224x224 (or up to 255x255) images give
  `(batch, n_output_classes)` logits.

  Args:
    d_hidden: Depth of the first hidden layer (later ones are multiples).
    n_output_classes: Number of output classes.
    mode: 'train', 'eval' or 'predict' (passed to `norm`).
    norm: Normalization layer constructor taking `mode=`, e.g. `BatchNorm`
      or `FilterResponseNorm`.
    non_linearity: Activation layer constructor, e.g. `Relu` (with
      BatchNorm) or `ThresholdedLinearUnit` (with FilterResponseNorm).

  Returns:
    The model as a `Serial` layer.
  """
  def Resnet50ConvBlock(filter_multiplier=1, strides=(2, 2)):
    filters = [filter_multiplier * d for d in (d_hidden, d_hidden,
                                                4 * d_hidden)]
    return ConvBlock(3, filters, strides, norm, non_linearity, mode)

  def Resnet50IdentityBlock(filter_multiplier=1):
    filters = [filter_multiplier * d for d in (d_hidden, d_hidden,
                                                4 * d_hidden)]
    return IdentityBlock(3, filters, norm, non_linearity, mode)

  return tl.Serial(
      tl.ToFloat(),
      tl.Conv(d_hidden, (7, 7), (2, 2), 'SAME'),
      norm(mode=mode),
      non_linearity(),
      tl.MaxPool(pool_size=(3, 3), strides=(2, 2)),
      Resnet50ConvBlock(strides=(1, 1)),
      [Resnet50IdentityBlock() for _ in range(2)],
      Resnet50ConvBlock(2),
      [Resnet50IdentityBlock(2) for _ in range(3)],
      Resnet50ConvBlock(4),
      [Resnet50IdentityBlock(4) for _ in range(5)],
      Resnet50ConvBlock(8),
      [Resnet50IdentityBlock(8) for _ in range(2)],
      tl.AvgPool(pool_size=(7, 7)),
      tl.Flatten(),
      tl.Dense(n_output_classes),
  )


def WideResnetBlock(channels, strides=(1, 1), bn_momentum=0.9, mode='train'):
  """Pre-activation block: (BatchNorm, Relu, 3x3 conv) twice, the first strided."""
  return [
      tl.BatchNorm(momentum=bn_momentum, mode=mode),
      tl.Relu(),
      tl.Conv(channels, (3, 3), strides, padding='SAME'),
      tl.BatchNorm(momentum=bn_momentum, mode=mode),
      tl.Relu(),
      tl.Conv(channels, (3, 3), padding='SAME'),
  ]


def WideResnetGroup(n, channels, strides=(1, 1), bn_momentum=0.9,
                    mode='train'):
  """A strided block with a 3x3 conv shortcut, then one residual over `n - 1` blocks.

  As in Trax, the `n - 1` further blocks sit in a single `Residual` (one
  skip connection around all of them).
  """
  shortcut = [tl.Conv(channels, (3, 3), strides, padding='SAME')]
  return [
      tl.Residual(WideResnetBlock(channels, strides, bn_momentum=bn_momentum,
                                  mode=mode), shortcut=shortcut),
      tl.Residual([WideResnetBlock(channels, (1, 1), bn_momentum=bn_momentum,
                                   mode=mode) for _ in range(n - 1)]),
  ]


@registry.register
def WideResnet(n_blocks=3, widen_factor=1, n_output_classes=10,
               bn_momentum=0.9, mode='train'):
  """Wide ResNet (https://arxiv.org/abs/1605.07146) for 32x32 images.

  Args:
    n_blocks: Blocks per group; the network has 6 * n_blocks + 4 layers.
    widen_factor: Width multiplier of the groups (1: a plain ResNet).
    n_output_classes: Number of output classes.
    bn_momentum: BatchNorm momentum.
    mode: 'train', 'eval' or 'predict' (passed to BatchNorm).

  Returns:
    The model as a `Serial` layer: `(batch, 32, 32, c)` images to
    `(batch, n_output_classes)` logits.
  """
  return tl.Serial(
      tl.ToFloat(),
      tl.Conv(16, (3, 3), padding='SAME'),
      WideResnetGroup(n_blocks, 16 * widen_factor, bn_momentum=bn_momentum,
                      mode=mode),
      WideResnetGroup(n_blocks, 32 * widen_factor, (2, 2),
                      bn_momentum=bn_momentum, mode=mode),
      WideResnetGroup(n_blocks, 64 * widen_factor, (2, 2),
                      bn_momentum=bn_momentum, mode=mode),
      tl.BatchNorm(momentum=bn_momentum, mode=mode),
      tl.Relu(),
      tl.AvgPool(pool_size=(8, 8)),
      tl.Flatten(),
      tl.Dense(n_output_classes),
  )
