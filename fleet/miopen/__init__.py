"""MIOpen's side of Fleet's Tuna workflow, with no database and no Celery.

- :mod:`fleet.miopen.driver`: MIOpenDriver command lines -> canonical problems (and back).
- :mod:`fleet.miopen.keys`: the find-db / perf-db key of a conv problem, and its inverse.
- :mod:`fleet.miopen.finddb`, :mod:`fleet.miopen.perfdb`, :mod:`fleet.miopen.kerneldb`: MIOpen's database
  files, read and written byte-for-byte deterministically.
- :mod:`fleet.miopen.select`: a small safe language to select problems by their parameters.
"""
