"""A training script as people write it, knowing nothing of torchherd: digits, an MLP, one line per epoch.

Run it alone with `python plain_train.py --lr 0.05`; sample_configs/script_plain.toml runs it
unchanged under torchherd and charts the `Epoch N, Loss: L` lines it prints.
"""
import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--epochs", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=32)
args = parser.parse_args()

digits = load_digits()  # 1,797 8x8 images, bundled with scikit-learn: no download
x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
y = torch.tensor(digits.target)
loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

for epoch in range(args.epochs):
    total = 0.0
    for inputs, targets in loader:
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item()
    print(f"Epoch {epoch + 1}, Loss: {total / len(loader):.4f}")
