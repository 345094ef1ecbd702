"""The same kind of script with torchherd.client: live steps, stop and pause keys, resume, background validation.

Alone (`python client_train.py`) every `herd.` call is a no-op and it trains as before;
under torchherd (sample_configs/script_client.toml) the marked lines report each step,
save and leave the loop when the stop key is pressed, resume from that checkpoint, and
hand the weights to the validator (val.py builds the model it scores them with).
"""
import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchherd.client as herd


def make_model():
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Dropout(0.1), nn.Linear(256, 10))


def load_data():
    """The same 80/20 split of the bundled digits in every process (this script and the validator)."""
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    split = int(len(x) * 0.8)
    return TensorDataset(x[order[:split]], y[order[:split]]), TensorDataset(x[order[split:]], y[order[split:]])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--epochs", type=int, default=60)
    args = parser.parse_args()

    train, _ = load_data()
    loader = DataLoader(train, batch_size=32, shuffle=True)
    torch.manual_seed(0)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start, step = 0, 0
    if (path := herd.resume_from()) is not None:  # the checkpoint this run saved last, after a stop or crash
        state = torch.load(path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, step = state["epoch"], state["step"]

    def save(next_epoch):
        herd.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": next_epoch,
                   "step": step})

    for epoch in range(start, args.epochs):
        for inputs, targets in loader:
            loss = nn.functional.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            herd.report(step=step, loss=loss.detach(), lr=args.lr, samples=len(targets))  # holds while paused
            if herd.checkpoint_requested():  # the `c` key
                save(epoch)
            if herd.should_stop():  # the `s` key, Ctrl-C or SIGHUP: this epoch is redone on resume
                save(epoch)
                return
        herd.epoch_end(epoch)
        herd.hand_off(model)  # scored by val.py's model while the next epoch trains
        save(epoch + 1)


if __name__ == "__main__":
    main()
