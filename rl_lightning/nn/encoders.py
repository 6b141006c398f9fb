"""Observation encoders: what turns an observation into the feature vector a Q-network's head reads.

- ``mlp``: the observation is the first layer's input: no encoder for float vectors, else flattened and
  scaled (:class:`FlatEncoder`, an MLP over a MinAtar grid say).
- ``nature_cnn``: the convolutional torso of Mnih et al. (2015, "Human-level control through deep
  reinforcement learning"): 32 8x8 filters of stride 4, 64 4x4 of stride 2, 64 3x3 of stride 1, each
  followed by a ReLU; 3136 features for 84x84 frames. Its fully connected layer of 512 is the head's
  first hidden layer (``algo.hidden_sizes: [512]``).
- ``minatar_cnn``: the torso of Young and Tian (2019, MinAtar): 16 3x3 filters of stride 1 and a ReLU; 1024
  features for 10x10 grids (the head's hidden layer of 128 follows).
- ``auto``: ``mlp`` for vector observations, ``nature_cnn`` for images of at least 36 pixels a side,
  ``minatar_cnn`` for smaller grids.

Image observations arrive channels-first and as stored (uint8): the encoder casts and scales them by
``1 / high`` of the observation spec on the device it runs on (255 for frames, 1 for MinAtar's 0/1 grids),
so frames cross to the GPU and sit in the replay at a byte per pixel.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchrl.data import Bounded, TensorSpec

__all__ = ["ENCODERS", "EncodedNet", "FlatEncoder", "ImageEncoder", "encoded", "feature_dim", "make_encoder"]

ENCODERS = ("auto", "mlp", "nature_cnn", "minatar_cnn")
#: The smallest side ``auto`` gives the Nature CNN (its three convolutions need 36 pixels).
_NATURE_MIN_SIDE = 36


class ImageEncoder(nn.Module):
    """A convolutional torso over channels-first images: ``[..., C, H, W] -> [..., out_features]``.

    Args:
        layers: the convolutions and activations.
        obs_shape: ``(C, H, W)`` of one observation (sets ``out_features``).
        scale: the inputs are multiplied by it after the cast to float (``1 / 255`` for frames).
    """

    def __init__(self, layers: nn.Sequential, obs_shape: tuple[int, ...], scale: float) -> None:
        super().__init__()
        self.layers = layers
        self.scale = float(scale)
        with torch.no_grad():
            self.out_features = int(layers(torch.zeros(1, *obs_shape)).flatten(1).shape[1])

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-3]
        h = self.layers(x.reshape(-1, *x.shape[-3:]).float() * self.scale)
        return h.reshape(*lead, -1)

    def extra_repr(self) -> str:
        return f"scale={self.scale:.6g}, out_features={self.out_features}"


class FlatEncoder(nn.Module):
    """``[..., *obs_shape] -> [..., prod(obs_shape)]``, cast to float and scaled: an MLP's input for
    observations that are not float vectors."""

    def __init__(self, obs_shape: tuple[int, ...], scale: float) -> None:
        super().__init__()
        self.ndim, self.scale = len(obs_shape), float(scale)
        self.out_features = int(torch.Size(obs_shape).numel())

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(-self.ndim).float() * self.scale

    def extra_repr(self) -> str:
        return f"scale={self.scale:.6g}, out_features={self.out_features}"


def nature_cnn(obs_shape: tuple[int, ...], scale: float) -> ImageEncoder:
    """The Nature DQN torso (see the module docstring)."""
    c = obs_shape[0]
    layers = nn.Sequential(
        nn.Conv2d(c, 32, 8, stride=4), nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
    )  # fmt: skip
    return ImageEncoder(layers, obs_shape, scale)


def minatar_cnn(obs_shape: tuple[int, ...], scale: float) -> ImageEncoder:
    """The MinAtar torso (see the module docstring)."""
    return ImageEncoder(nn.Sequential(nn.Conv2d(obs_shape[0], 16, 3, stride=1), nn.ReLU()), obs_shape, scale)


def _scale(spec: TensorSpec) -> float:
    """``1 / high`` for a uint8 spec (stored frames), 1 otherwise."""
    if isinstance(spec, Bounded) and spec.dtype == torch.uint8:
        return 1.0 / float(spec.space.high.max())
    return 1.0


def make_encoder(name: str, observation_spec: TensorSpec) -> ImageEncoder | FlatEncoder | None:
    """The encoder ``name`` (see :data:`ENCODERS`) for the observations of ``observation_spec`` (batch dim
    first); ``None`` for ``mlp`` over float vectors: the head reads the observation itself.

    Raises:
        ValueError: an unknown name, or a CNN for observations that are not ``[C, H, W]`` images.
    """
    if name not in ENCODERS:
        raise ValueError(f"algo.encoder={name!r}: use one of {list(ENCODERS)}.")
    shape = tuple(observation_spec.shape[1:])
    if name == "auto":
        name = (
            "mlp"
            if len(shape) != 3
            else "nature_cnn"
            if min(shape[1:]) >= _NATURE_MIN_SIDE
            else "minatar_cnn"
        )
    if name == "mlp":
        if len(shape) == 1 and observation_spec.dtype.is_floating_point:
            return None
        return FlatEncoder(shape, _scale(observation_spec))
    if len(shape) != 3:
        raise ValueError(
            f"algo.encoder={name} needs channels-first image observations [C, H, W], but they are "
            f"{list(shape)}; use algo.encoder=mlp (or auto)."
        )
    if name == "nature_cnn" and min(shape[1:]) < _NATURE_MIN_SIDE:
        raise ValueError(
            f"algo.encoder=nature_cnn needs images of at least {_NATURE_MIN_SIDE}x{_NATURE_MIN_SIDE}, got "
            f"{shape[1]}x{shape[2]}; use algo.encoder=minatar_cnn (or auto)."
        )
    build = nature_cnn if name == "nature_cnn" else minatar_cnn
    return build(shape, _scale(observation_spec))


class EncodedNet(nn.Module):
    """An encoder followed by a head: ``head(encoder(x), *args, **kwargs)``.

    The head's extra arguments (IQN's fractions, the noisy switch) pass through, so an algorithm calls an
    encoded network as it calls its head alone.
    """

    def __init__(self, encoder: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward(self, x: Tensor, *args: object, **kwargs: object) -> Tensor:
        return self.head(self.encoder(x), *args, **kwargs)


def encoded(encoder: nn.Module | None, head: nn.Module) -> nn.Module:
    """``head`` alone without an encoder (vector observations keep their networks and parameter names),
    else an :class:`EncodedNet`."""
    return head if encoder is None else EncodedNet(encoder, head)


def feature_dim(encoder: ImageEncoder | FlatEncoder | None, observation_spec: TensorSpec) -> int:
    """What the head reads: the encoder's features, or the flattened observation's size."""
    if encoder is not None:
        return encoder.out_features
    return int(torch.Size(observation_spec.shape[1:]).numel())
