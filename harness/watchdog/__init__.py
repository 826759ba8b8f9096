"""Job control: the watchdog that ends a job that cannot finish, naming the rank, its host and what happened.

Every rank beats a heartbeat (where it is, how far it got) to the job's watchdog, wherever both
run; the watchdog judges the beats and the ranks' ends, and on a verdict ends the whole job.
One module per job:

- ``heartbeat_row``: the row a rank's state travels in, and how to copy it consistently;
- ``heartbeat``: the rank's side, beating into its row;
- ``heartbeat_net``: the row over TCP, from every rank to the watchdog;
- ``verdict``: the pure judge: which rank died or hung first, and what followed;
- ``supervision``: the launcher's side: start the ranks, watch them, stop the job on a verdict;
- ``in_job``: how a rank joins its watchdog, and the one rank 0 runs in a job the user started.

Finding and stopping the job's processes is ``harness.process_tree``'s; the rank's own runtime
(``harness.runner``) only beats.
"""
