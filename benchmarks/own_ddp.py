"""An ordinary DDP script, as a new user writes one (not sortie's trainer): an MLP on random data,
gloo, a DistributedSampler, `step N/M` from rank 0, the model saved to outputs/model.pt by rank 0,
then a barrier and destroy_process_group(). `benchmarks/own_job.py` runs it."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--stop-before-save", action="store_true")  # a run cut short before it saves
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 32), torch.randn(512, 1))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=32, sampler=sampler)
model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
total, step = args.epochs * len(loader), 0
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for inputs, targets in loader:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
        step += 1
        if rank == 0 and step % 4 == 0:
            print(f"step {step}/{total}", flush=True)
if args.stop_before_save:
    raise SystemExit(3)
if rank == 0:
    os.makedirs("outputs", exist_ok=True)
    torch.save(model.module.state_dict(), "outputs/model.pt")
    print("saved outputs/model.pt", flush=True)
dist.barrier()
dist.destroy_process_group()
