"""Tuna's workflow on Fleet: MIOpen problems from driver lines, jobs, find-db/perf-db/kernel-db, golden sets.

A problem is kind ``conv`` or ``bnorm`` with canonical parameters, one per direction, so each conv problem
has exactly one MIOpen database key (kept, indexed, in ``miopen_keys``; MIOpen keeps no such key for bnorm).
Pooling lines become problems of kind ``pool`` (tagged and queryable like the others; MIOpen keeps no tuning
database for pooling, so they have no key and are never tuned). A database record that maps to no driver
problem is kept as it is, as a problem of kind ``miopen-record`` (queryable by its key, never tuned).
"Recurrent" is the tag ``recurrent``. A *reason* is a campaign named ``REASON@TARGET`` running the ``miopen``
workload; its trials are ordinary trials, so ``fleet worker`` processes run them through the compile and
evaluate tasks.
"""

RECURRENT = "recurrent"
KINDS = ("conv", "bnorm")  # the kinds jobs tune
POOL = "pool"
RAW = "miopen-record"
