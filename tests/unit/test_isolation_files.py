"""Every path a spec or an imported file names goes through the one check (issue 44): inside its folder, a regular
file, reached through no link, read to a bound. Tried as an attacker who hands Fleet a T1 file or a spec would:
through the real ``fleet validate`` command, with the URLs in its environment to steal.

fleet/bundle.py (read_inside), fleet/spec/campaign.py, fleet/interop/t1.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.bundle import unpack_files
from fleet.spec import load_spec

DATA = Path(__file__).resolve().parents[1] / "data" / "t1"
SECRET = "postgresql://fleet:hunter2@db/fleet"


def validate(path: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """``fleet validate PATH`` as a submitter with the fleet's URL in their environment runs it."""
    env = {"FLEET_HOME": str(home), "PATH": "/usr/bin:/bin", "FLEET_DATABASE_URL": SECRET}
    return subprocess.run(
        [sys.executable, "-m", "fleet.cli", "validate", str(path)], capture_output=True, text=True, timeout=60, env=env
    )


def t1_file(folder: Path, kernel_file: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(DATA / "vector_add.c", folder / "vector_add.c")
    data = json.loads((DATA / "vector_add_c.json").read_text())
    data["KernelSpecification"]["KernelFile"] = kernel_file
    path = folder / "t1.json"
    path.write_text(json.dumps(data))
    return path


def plant(folder: Path) -> Path:
    """A secret beside the attacker's folder, a link to it, a link to a folder above, and a FIFO inside."""
    secret = folder.parent / "secret.c"
    secret.write_text(f"/* {SECRET} */\n")
    (folder / "link.c").symlink_to(secret)
    (folder / "up").symlink_to(folder.parent)
    os.mkfifo(folder / "fifo.c")
    return secret


@pytest.mark.parametrize(
    "name", ["/proc/self/environ", "/etc/passwd", "../../secret.c", "../t1/../secret.c", "link.c", "up/secret.c"]
)
def test_a_t1_kernel_file_naming_any_file_outside_its_folder_is_one_line_and_exit_1(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "a" / "t1"
    path = t1_file(folder, name)
    plant(folder)
    done = validate(path, tmp_path / "home")
    assert done.returncode == 1, done.stdout
    assert len(done.stderr.strip().splitlines()) == 1 and "KernelFile" in done.stderr, done.stderr
    assert SECRET not in done.stdout + done.stderr and "hunter2" not in done.stderr


def test_a_t1_kernel_file_that_is_a_fifo_or_a_folder_is_refused_without_waiting(tmp_path: Path) -> None:
    folder = tmp_path / "t1"
    path = t1_file(folder, "fifo.c")
    plant(folder)
    done = validate(path, tmp_path / "home")  # a FIFO with no writer: a plain open would never return
    assert done.returncode == 1 and "must be a regular file" in done.stderr, done.stderr
    (folder / "dir.c").mkdir()
    path = t1_file(folder, "dir.c")
    done = validate(path, tmp_path / "home")
    assert done.returncode == 1 and "must be a regular file" in done.stderr, done.stderr


def test_a_t1_kernel_file_beside_it_or_in_its_parent_folder_is_still_read(tmp_path: Path) -> None:
    folder = tmp_path / "t1"
    spec = load_spec(t1_file(folder, "vector_add.c"))
    files = unpack_files(next(iter(spec.files.values())))
    assert files["vector_add.c"] == (DATA / "vector_add.c").read_bytes()
    shutil.move(folder / "vector_add.c", tmp_path / "vector_add.c")  # Kernel Tuner's second place
    assert "vector_add.c" in unpack_files(next(iter(load_spec(folder / "t1.json").files.values())))


def spec_file(folder: Path, **workload: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "k.c").write_text("int main(void) { return 0; }\n")
    data = {
        "name": "s",
        "problems": [{"kind": "p", "params": {}}],
        "space": {"knobs": {"x": [1, 2]}},
        "workload": {"kind": "command", "run": ["./k"], "objective": {"json": "t"}, **workload},
    }
    path = folder / "spec.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("name", ["link.c", "up/secret.c", "fifo.c", "/proc/self/environ", "../secret.c"])
def test_a_spec_source_goes_through_the_same_check(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "spec"
    path = spec_file(folder, sources=["k.c", name])
    plant(folder)
    done = validate(path, tmp_path / "home")
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "workload source" in done.stderr and "must be a regular file inside" in done.stderr, done.stderr


def test_sources_past_their_bound_are_refused_before_they_are_read_whole(tmp_path: Path) -> None:
    folder = tmp_path / "spec"
    path = spec_file(folder, sources=["k.c", "big.bin"])
    with (folder / "big.bin").open("wb") as big:
        big.truncate(65 << 20)  # sparse: 65 MiB that take no disk
    done = validate(path, tmp_path / "home")
    assert done.returncode == 1 and "is larger than 64 MiB" in done.stderr, done.stderr


def test_a_space_file_that_is_a_link_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "spec"
    (tmp_path / "space.py").write_text("x = [1, 2]\n")
    path = spec_file(folder)
    (folder / "space.py").symlink_to(tmp_path / "space.py")
    data = json.loads(path.read_text())
    data["space"] = "space.py"
    path.write_text(json.dumps(data))
    done = validate(path, tmp_path / "home")
    assert done.returncode == 1 and "space file 'space.py' must be a regular file" in done.stderr, done.stderr


def test_a_spec_naming_another_campaigns_stored_sources_by_digest_is_refused(tmp_path: Path) -> None:
    """A digest is no secret (``fleet show`` prints a campaign's workload): naming the victim's sources' digest as
    the attacker's own ``bundle`` would have the worker unpack them into the attacker's build."""
    victim = load_spec(spec_file(tmp_path / "victim", sources=["k.c"]))
    digest = victim.workload["bundle"]
    attacker = spec_file(tmp_path / "attacker", bundle=digest, build=["cat", "k.c"])
    done = validate(attacker, tmp_path / "home")
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "is not the digest of sources this spec brings" in done.stderr, done.stderr
    # Nor with sources of its own beside it: the bundle is the one its own sources make, never the one it names.
    mixed = spec_file(tmp_path / "mixed", bundle=digest, sources=["k.c"])
    (tmp_path / "mixed" / "k.c").write_text("/* mine */\n")
    assert load_spec(mixed).workload["bundle"] != digest


def fleet_cli(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleet.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"FLEET_HOME": str(home), "PATH": "/usr/bin:/bin", **env},
    )


def peak_kib(done: subprocess.CompletedProcess[str]) -> int:
    """The child's peak memory, from /usr/bin/time's line (the last of stderr)."""
    return int(done.stderr.strip().splitlines()[-1])


def test_a_gzip_that_expands_past_the_import_bound_is_refused_without_taking_its_size_in_memory(tmp_path: Path) -> None:
    """Issue 44, item 6: a gzip of 1.5 MB that expands to 1.5 GB took 3.1 GB of memory to refuse."""
    import gzip

    bomb = tmp_path / "bomb.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as out:
        out.write(b'{"cache": {"' + b" " * (128 << 20))  # 128 MiB of blanks: a few hundred kilobytes zipped
    assert bomb.stat().st_size < 1 << 20
    timed = ["/usr/bin/time", "-f", "%M", sys.executable, "-m", "fleet.cli", "import", "kt", str(bomb)]
    env = {"FLEET_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "FLEET_IMPORT_BYTES": str(8 << 20)}
    done = subprocess.run(timed, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1
    said = [line for line in done.stderr.strip().splitlines()[:-1] if not line.startswith("Command exited")]
    assert said == [f"fleet: error: {bomb}: holds more than 8 MiB (FLEET_IMPORT_BYTES)"], said
    assert peak_kib(done) < 100 << 10, peak_kib(done)  # Python and Fleet, and far less than the 128 MiB it expands to


def test_a_kernel_tuner_file_nested_100000_deep_is_one_line(tmp_path: Path) -> None:
    """Issue 44, item 7: it ended in RecursionError's traceback."""
    deep = tmp_path / "deep.json"
    deep.write_text('{"cache": ' + "[" * 100_000 + "]" * 100_000 + "}")
    done = fleet_cli(tmp_path / "home", "import", "kt", str(deep))
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [f"fleet: error: {deep}: nested too deeply"]


@pytest.mark.parametrize(
    ("size", "said"), [("+".join(["1"] * 200_000), "at most 4096 are allowed"), ("+".join(["1"] * 2000), "too deeply")]
)
def test_a_t1_size_of_many_terms_is_one_line(tmp_path: Path, size: str, said: str) -> None:
    """Issue 44, item 7: a Size of 200,000 added terms ended in RecursionError's traceback."""
    path = t1_file(tmp_path / "t1", "vector_add.c")
    data = json.loads(path.read_text())
    data["KernelSpecification"]["Arguments"] = [
        {"Name": "a", "Type": "float", "MemoryType": "Vector", "Size": size, "FillType": "Random"}
    ]
    path.write_text(json.dumps(data))
    done = validate(path, tmp_path / "home")
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert said in done.stderr, done.stderr
