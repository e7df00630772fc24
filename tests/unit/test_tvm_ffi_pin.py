"""The pinned apache-tvm-ffi serializes modules: 0.1.15 segfaults in ``ToJSONGraph`` on any of them.

pyproject.toml pins apache-tvm-ffi in the tvm and dev extras. A MetaSchedule database writes each workload as a
serialized IRModule, so a segfault there ends every tuning run. The serialization runs in a child process: a
crash is this test's failure, not pytest's end.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

import pytest

pytest.importorskip("tvm")

PROGRAM = """
import json
import tvm
from tvm import te
import tvm.s_tir.meta_schedule as ms

a = te.placeholder((16, 16), name="A")
b = te.placeholder((16, 16), name="B")
k = te.reduce_axis((0, 16), name="k")
c = te.compute((16, 16), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
text = tvm.ir.save_json(mod)
again = tvm.ir.load_json(text)
workload = ms.database.MemoryDatabase().commit_workload(mod)
print(json.dumps({"json": len(text), "equal": tvm.ir.assert_structural_equal(mod, again) is None,
                  "workload": list(workload.as_json())}))
"""


def test_the_pinned_ffi_is_installed() -> None:
    assert version("apache-tvm-ffi") == "0.1.14.post0"


def test_a_module_serializes_and_commits_as_a_metaschedule_workload() -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"serializing a module exited {done.returncode}: {done.stderr[-2000:]}"
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["json"] > 1000 and out["equal"]
    shash, encoded = out["workload"]
    assert int(shash) >= 0 and len(encoded) > 100  # [structural hash, base64 IRModule]
