"""The validation factory for client_loop.py: the same model and held-out data from the same rule."""
import torch
from torch import nn
from torch.utils.data import TensorDataset

import torchherd.client as herd


def build(params):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=g)
    return herd.Validation(model=nn.Linear(4, 1), val_data=TensorDataset(x, x.sum(dim=1, keepdim=True) * 3 + 1),
                           loss_fn=nn.functional.mse_loss)
