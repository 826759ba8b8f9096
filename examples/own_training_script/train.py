"""A plain PyTorch training loop (AdamW, cosine schedule, gradient clipping, BatchNorm), made
WAGMA-SGD (or any algorithm of the harness) by the lines marked HARNESS.

Run it:

    python -m harness launch --scenario examples/own_training_script/scenario.yaml \
        examples/own_training_script/train.py
    python -m harness compare results/own_training_script/<run id>

or on its own, with the algorithm it names below and no injection: ``mpiexec -n 4 python train.py``.
"""

import argparse

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import harness.api as hx  # HARNESS

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=3e-3)
args = parser.parse_args()

# The data: scikit-learn's handwritten digits (8x8 images, 10 classes), the same on every rank.
digits = load_digits()
x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
y = torch.tensor(digits.target, dtype=torch.int64)
train_x, train_y, test_x, test_y = x[:1500], y[:1500], x[1500:], y[1500:]

# HARNESS: join the job. A scenario given by `harness launch --scenario` replaces these defaults
# (algorithm, iterations, batch size) and injects its stragglers, slow links and faults.
with hx.Run(algorithm="wagma", group_size=2, iterations=60, batch_size=32) as run:
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.BatchNorm1d(128), torch.nn.ReLU(), torch.nn.Linear(128, 10),
    ).to(run.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    optimizer = hx.DistributedOptimizer(optimizer, model)  # HARNESS: the algorithm communicates in step()
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=run.iterations)

    # Each rank draws its own batches from its own shard of the training set.
    shard = torch.arange(run.rank, len(train_y), run.size)
    order = torch.Generator().manual_seed(run.seed + run.rank)
    for step in range(run.iterations):
        batch = shard[torch.randint(len(shard), (run.batch_size,), generator=order)]
        inputs, labels = train_x[batch].to(run.device), train_y[batch].to(run.device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step(loss=loss)  # HARNESS: loss= goes into steps.csv (optional)
        schedule.step()

    def test(net):
        with torch.no_grad():
            logits = net(test_x.to(run.device))
        labels = test_y.to(run.device)
        return F.cross_entropy(logits, labels).item(), (logits.argmax(1) == labels).float().mean().item()

    optimizer.evaluate(test)  # HARNESS: test accuracy of the averaged model, into the summary
