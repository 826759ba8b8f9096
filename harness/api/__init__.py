"""Use the harness's algorithms inside your own PyTorch training script.

Your loop stays yours (model, data, any ``torch.optim`` optimizer, gradient clipping, learning
rate schedulers, CPU or GPU); three lines make it WAGMA-SGD, SGP or any registered algorithm,
under a scenario's injected stragglers, slow links and faults, with the same results directory
``python -m harness run`` writes (so ``compare`` and ``figures`` work on it)::

    import harness.api as hx

    with hx.Run(algorithm="wagma", group_size=4, iterations=200, batch_size=64) as run:
        model = Net().to(run.device)
        opt = hx.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3), model)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=run.iterations)
        for t in range(run.iterations):
            x, y = my_batch(t, run.rank)
            opt.zero_grad()
            loss = F.cross_entropy(model(x.to(run.device)), y.to(run.device))
            loss.backward()
            opt.step(loss=loss)          # the algorithm communicates here
            sched.step()
        opt.evaluate(my_test)            # optional: accuracy of the averaged model in the results

Start it with ``mpiexec -n 8 python train.py``, ``srun --mpi=pmi2 python train.py``, or
``python -m harness launch -n 8 [--scenario FILE] train.py ARGS`` (the venv's mpiexec, the
watchdog, and one run of the script per algorithm the scenario lists). docs/guides/own-code.md, "Your own
model, data, loop or algorithm", is the guide; :class:`Run` and :class:`DistributedOptimizer`
document the contract.
"""

from harness.api.optimizer import DistributedOptimizer
from harness.api.session import Run, ScriptError

__all__ = ["DistributedOptimizer", "Run", "ScriptError"]
