"""Noisy linear layers (Fortunato et al. 2018) with the noise switched by the caller, not by global state.

TorchRL's ``NoisyLinear`` decides whether to add its noise from the global exploration type (or, with
``use_exploration_type=False``, from ``self.training``). Neither says what an RL update needs: the
update and the exploring policy use the noisy weights, the evaluation policy the mean weights, and the
same module is in ``train()`` mode for all three during a fit. Here the layer keeps TorchRL's
parameterisation, initialisation and factorized noise sampling (``reset_noise``), and the caller says
``noisy=True`` or ``False`` in every forward; the choice is a Python constant per call site, so compiled
and graphed paths specialise on it instead of reading mutable state.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchrl.modules import NoisyLinear as _TorchRLNoisyLinear

__all__ = ["NoisyLinear", "NoisyMLP", "reset_noise"]


class NoisyLinear(_TorchRLNoisyLinear):
    """Factorized Gaussian noisy layer.

    :math:`y = (\\mu^w + \\sigma^w \\odot \\epsilon^w) x + \\mu^b + \\sigma^b \\odot \\epsilon^b` with
    :math:`\\epsilon^w = f(\\epsilon_{out}) f(\\epsilon_{in})^T`, :math:`\\epsilon^b = f(\\epsilon_{out})`,
    :math:`f(x) = \\mathrm{sgn}(x) \\sqrt{|x|}` with standard normal :math:`\\epsilon_{in}, \\epsilon_{out}`,
    resampled only by :meth:`reset_noise` (on the parameters' device, with torch's RNG). Initialisation:
    :math:`\\mu \\sim U[-1/\\sqrt{p}, 1/\\sqrt{p}]`, :math:`\\sigma^w = \\sigma_0/\\sqrt{p}`,
    :math:`\\sigma^b = \\sigma_0/\\sqrt{q}` for ``p`` inputs and ``q`` outputs.

    Args:
        in_features: input width ``p``.
        out_features: output width ``q``.
        std_init: :math:`\\sigma_0` (0.5 in the paper).

    Shapes:
        input ``[..., in_features]``; output ``[..., out_features]``.
    """

    def __init__(self, in_features: int, out_features: int, std_init: float = 0.5) -> None:
        super().__init__(in_features, out_features, std_init=std_init, use_exploration_type=False)

    def forward(self, x: Tensor, noisy: bool = True) -> Tensor:
        """``noisy=False``: the mean weights only (the deterministic policy).

        The noisy weights are made with one ``addcmul``: one pass and one new weight-sized tensor instead of
        a multiply and an add with two. Acting on one observation, making them costs more than the product.
        """
        if noisy:
            weight = torch.addcmul(self.weight_mu, self.weight_sigma, self.weight_epsilon)
            bias = torch.addcmul(self.bias_mu, self.bias_sigma, self.bias_epsilon)
        else:
            weight, bias = self.weight_mu, self.bias_mu
        return F.linear(x, weight, bias)


def reset_noise(module: nn.Module) -> None:
    """Resamples the noise of every :class:`NoisyLinear` in ``module`` (no-op for other layers)."""
    for layer in module.modules():
        if isinstance(layer, NoisyLinear):
            layer.reset_noise()


class NoisyMLP(nn.Module):
    """An MLP (ReLU between layers) whose layers are :class:`NoisyLinear` when ``noisy``, else ``nn.Linear``.

    Args:
        in_features: input width.
        hidden_sizes: hidden widths (may be empty: a single layer).
        out_features: output width.
        noisy: noisy layers instead of plain ones.
        std_init: :math:`\\sigma_0` of the noisy layers.
        activate_last: a ReLU after the output layer too.

    Shapes:
        input ``[..., in_features]``; output ``[..., out_features]``.
    """

    def __init__(
        self,
        in_features: int,
        hidden_sizes: Sequence[int],
        out_features: int,
        noisy: bool = False,
        std_init: float = 0.5,
        activate_last: bool = False,
    ) -> None:
        super().__init__()
        dims = [in_features, *hidden_sizes, out_features]
        self.noisy = noisy
        self.activate_last = activate_last
        self.layers = nn.ModuleList(
            NoisyLinear(a, b, std_init) if noisy else nn.Linear(a, b) for a, b in itertools.pairwise(dims)
        )

    def forward(self, x: Tensor, noisy: bool = True) -> Tensor:
        """``noisy`` switches the noise of noisy layers (ignored for plain ones)."""
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, noisy) if self.noisy else layer(x)
            if i < last or self.activate_last:
                x = F.relu(x)
        return x
