"""Tuna's workflow on Fleet: MIOpen problems from driver lines, jobs, find-db/perf-db/kernel-db, golden sets.

A problem is kind ``conv`` or ``bnorm`` with canonical parameters, one per direction, so each conv problem
has exactly one MIOpen database key (kept, indexed, in ``miopen_keys``; MIOpen keeps no such key for bnorm).
"Recurrent" is the tag ``recurrent``. A *reason* is a campaign named ``REASON@TARGET`` running the ``miopen``
workload; its trials are ordinary trials, so ``fleet worker`` processes run them through the compile and
evaluate tasks.
"""

RECURRENT = "recurrent"
KINDS = ("conv", "bnorm")
