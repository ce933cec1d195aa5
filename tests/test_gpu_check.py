"""scripts/gpu-check: its nvidia-smi parsers on the layouts real drivers print, the read-only
guard, and the whole script on mock machines (every row PASS or an explained SKIP)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from waiting import deadline

from gpu_operator.nvml import catalog, mock

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-check"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


gpu_check = _load()

# Layouts as drivers print them (values made up): -L with MIG devices, the narrow (R470-R535) and
# the wide (R550+) -lgip, and -lgi/-lci with and without the Placement column of older drivers.
LIST = """\
GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-11111111-2222-3333-4444-555555555555)
  MIG 3g.40gb     Device  0: (UUID: MIG-aaaaaaaa-2222-3333-4444-555555555555)
  MIG 1g.10gb+me  Device  1: (UUID: MIG-bbbbbbbb-2222-3333-4444-555555555555)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-66666666-2222-3333-4444-555555555555)
"""
LGIP_NARROW = """\
+-----------------------------------------------------------------------------+
| GPU instance profiles:                                                      |
| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |
|                              Free/Total   GiB              CE    JPEG  OFA  |
|=============================================================================|
|   0  MIG 1g.10gb       19     6/7        9.75       No     16     1     0   |
|                                                             1     1     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 1g.10gb+me    20     0/1        9.75       No     16     1     0   |
|                                                             1     1     1   |
+-----------------------------------------------------------------------------+
|   0  MIG 7g.80gb        0     0/1        79.25      No     132    7     0   |
|                                                             8     7     1   |
+-----------------------------------------------------------------------------+
"""
LGIP_WIDE = """\
+-------------------------------------------------------------------------------+
| GPU instance profiles:                                                        |
| GPU   Name               ID    Instances   Memory     P2P    SM    DEC   ENC  |
|                                Free/Total   GiB              CE    JPEG  OFA  |
|===============================================================================|
|   1  MIG 1g.18gb+me.all  15     1/1        16.50      No     16     7     0   |
|                                                               1     7     1   |
+-------------------------------------------------------------------------------+
"""
LGI = """\
+-------------------------------------------------------+
| GPU instances:                                        |
| GPU   Name             Profile  Instance   Placement  |
|                          ID       ID       Start:Size |
|=======================================================|
|   0  MIG 3g.40gb          9        2          4:4     |
+-------------------------------------------------------+
|   0  MIG 1g.10gb+me      20       13          0:1     |
+-------------------------------------------------------+
"""
LGI_OLD = """\
+----------------------------------------------------+
| GPU instances:                                     |
| GPU   Name          Profile  Instance              |
|                       ID       ID                  |
|====================================================|
|   0  MIG 3g.40gb       9        2                  |
+----------------------------------------------------+
"""
LCI = """\
+--------------------------------------------------------------------+
| Compute instances:                                                 |
| GPU     GPU       Name             Profile   Instance   Placement  |
|       Instance                       ID        ID       Start:Size |
|         ID                                                         |
|====================================================================|
|   0      2       MIG 1c.3g.40gb       0         0          0:1     |
+--------------------------------------------------------------------+
|   0      2       MIG 1c.3g.40gb       0         1          1:1     |
+--------------------------------------------------------------------+
"""
LCI_OLD = """\
+-------------------------------------------------------+
| Compute instances:                                    |
| GPU     GPU       Name             Profile   Instance |
|       Instance                       ID        ID     |
|         ID                                            |
|=======================================================|
|   0     13       MIG 1g.10gb          0         0     |
+-------------------------------------------------------+
"""


def test_the_list_gives_gpus_and_their_mig_devices() -> None:
    listing = gpu_check.parse_list(LIST)
    assert [g[0] for g in listing.gpus] == [0, 1]
    assert listing.gpus[1][1] == "NVIDIA H100 80GB HBM3"
    assert [(m.gpu, m.profile, m.index) for m in listing.migs] == [
        (0, "3g.40gb", 0),
        (0, "1g.10gb+me", 1),
    ]
    assert listing.migs[1].uuid == "MIG-bbbbbbbb-2222-3333-4444-555555555555"


def test_query_rows_and_their_field_count() -> None:
    rows = gpu_check.parse_query("0, NVIDIA L4, 23034, [N/A]\n", ["index", "name", "m", "mig"])
    assert rows == [{"index": "0", "name": "NVIDIA L4", "m": "23034", "mig": "[N/A]"}]
    with pytest.raises(ValueError, match="3 values"):
        gpu_check.parse_query("0, NVIDIA L4, 1\n", ["index", "name", "m", "mig"])


def test_profiles_parse_in_both_column_layouts() -> None:
    narrow = gpu_check.parse_profiles(LGIP_NARROW)
    assert [(p.gpu, p.name, p.profile_id, p.free, p.total) for p in narrow] == [
        (0, "1g.10gb", 19, 6, 7),
        (0, "1g.10gb+me", 20, 0, 1),
        (0, "7g.80gb", 0, 0, 1),
    ]
    (wide,) = gpu_check.parse_profiles(LGIP_WIDE)
    assert (wide.gpu, wide.name, wide.profile_id, wide.total) == (1, "1g.18gb+me.all", 15, 1)


def test_instances_parse_with_and_without_placements() -> None:
    rows = gpu_check.parse_gpu_instances(LGI)
    assert [(r.gpu, r.gi, r.ci, r.name, r.profile_id, r.placement) for r in rows] == [
        (0, 2, None, "3g.40gb", 9, (4, 4)),
        (0, 13, None, "1g.10gb+me", 20, (0, 1)),
    ]
    (old,) = gpu_check.parse_gpu_instances(LGI_OLD)
    assert (old.gi, old.name, old.placement) == (2, "3g.40gb", None)
    compute = gpu_check.parse_compute_instances(LCI)
    assert [(r.gpu, r.gi, r.ci, r.name, r.placement) for r in compute] == [
        (0, 2, 0, "1c.3g.40gb", (0, 1)),
        (0, 2, 1, "1c.3g.40gb", (1, 1)),
    ]
    (old_ci,) = gpu_check.parse_compute_instances(LCI_OLD)
    assert (old_ci.gi, old_ci.ci, old_ci.placement) == (13, 0, None)
    assert gpu_check.parse_gpu_instances(LCI) == []  # the tables are not confused


def test_metrics_samples_keep_their_labels() -> None:
    text = (
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1",modelName="NVIDIA \\"X\\""} 31\n'
        "up 1\n"
    )
    (sample,) = gpu_check.parse_metrics(text)
    assert sample.name == "DCGM_FI_DEV_GPU_TEMP"
    assert sample.labels["UUID"] == "GPU-1"
    assert sample.value == 31


def test_names_follow_gfd_and_the_device_plugin() -> None:
    assert gpu_check.sanitise("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert gpu_check.sanitise("NVIDIA RTX PRO 6000 (Server)") == "NVIDIA-RTX-PRO-6000-Server"
    assert gpu_check.mig_resource("1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"
    assert gpu_check.mig_resource("2g.24gb-me") == "nvidia.com/mig-2g.24gb-me"


def test_the_simulated_nvidia_smi_parses_like_a_real_one() -> None:
    from simhost import nvidia_smi

    machine = mock.MockMachine.from_preset("dgx-a100-mig-mixed", seed=1)
    lib = machine.nvml()
    everything = nvidia_smi.Visible(all=True)
    now = nvidia_smi.dt.datetime(2026, 1, 1)
    listing = gpu_check.parse_list(nvidia_smi.run(lib, everything, ["-L"], now)[1])
    assert len(listing.gpus) == 8
    assert len(listing.migs) == 32
    profiles = gpu_check.parse_profiles(nvidia_smi.run(lib, everything, ["mig", "-lgip"], now)[1])
    assert {p.name for p in profiles} >= {"1g.5gb", "1g.5gb+me", "7g.40gb"}
    gis = gpu_check.parse_gpu_instances(nvidia_smi.run(lib, everything, ["mig", "-lgi"], now)[1])
    cis = gpu_check.parse_compute_instances(
        nvidia_smi.run(lib, everything, ["mig", "-lci"], now)[1]
    )
    assert len(gis) == len(cis) == 32
    assert all(r.placement is not None for r in gis + cis)


def test_the_guard_refuses_every_call_that_would_change_a_gpu() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100-mig-mixed", seed=1)
    lib = gpu_check.ReadOnly(machine.nvml())
    lib.init()
    gpu = lib.device_by_index(0)
    with pytest.raises(gpu_check.ReadOnlyViolation, match="set_mig_mode"):
        gpu.set_mig_mode(False)
    with pytest.raises(gpu_check.ReadOnlyViolation):
        gpu.create_gpu_instance(catalog.GI_PROFILE_1_SLICE)
    (gi,) = gpu.gpu_instances(catalog.GI_PROFILE_2_SLICE)
    with pytest.raises(gpu_check.ReadOnlyViolation):
        gi.destroy()
    with pytest.raises(gpu_check.ReadOnlyViolation):
        gi.create_compute_instance(0)
    (ci,) = gi.compute_instances(catalog.CI_PROFILE_BY_SLICES[2])
    with pytest.raises(gpu_check.ReadOnlyViolation):
        ci.destroy()
    # Reads work, handed-out objects included (unwrapped where the backend needs its own).
    assert gpu.topology_common_ancestor(lib.device_by_index(1)) is not None
    assert gpu.mig_device_by_index(0).name().startswith("NVIDIA A100-SXM4-40GB MIG ")
    with pytest.raises(gpu_check.ReadOnlyViolation):
        gpu_check.ReadOnlyHost().reset_gpus([])
    assert machine.gpus[0].mig_current
    assert len(gpu.gpu_instances(catalog.GI_PROFILE_2_SLICE)) == 1  # nothing was destroyed


def test_the_guard_wraps_the_real_backend_too() -> None:
    from gpu_operator import nvml
    from gpu_operator.nvml import mock_pynvml, real

    machine = mock.MockMachine.from_preset("dgx-a100-mig-mixed", seed=1)
    lib = gpu_check.ReadOnly(real.RealNvml(module=mock_pynvml.MockPynvml(machine)))
    lib.init()
    try:
        gpu = lib.device_by_index(0)
        assert isinstance(gpu, gpu_check.ReadOnly)
        with pytest.raises(gpu_check.ReadOnlyViolation):
            gpu.set_mig_mode(False)
        (gi,) = gpu.gpu_instances(catalog.GI_PROFILE_2_SLICE)
        with pytest.raises(gpu_check.ReadOnlyViolation):
            gi.destroy()
        events = lib.event_set()
        events.register(gpu, nvml.EventType.XID_CRITICAL)  # the backend gets its own device
        with pytest.raises(nvml.Timeout):
            events.wait(1)
        events.free()
    finally:
        lib.shutdown()


def _nonroot_runs() -> bool:
    """Whether the check can run GFD as uid 65532 here: as root, with setpriv, from a checkout
    that user can reach (a clone in a `mktemp -d` folder, mode 0700, is not: the row then SKIPs
    and says why)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    return all(folder.stat().st_mode & 0o001 for folder in (ROOT, *ROOT.parents))


@pytest.mark.parametrize(
    ("preset", "mig"), [("dgx-a100-mig-mixed", True), ("l4x8", False)], ids=["mig", "no-mig"]
)
def test_the_whole_check_passes_on_a_mock_machine(preset: str, mig: bool, tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(SCRIPT), "--mock", preset, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=deadline(300),
        check=False,
    )
    shown = proc.stdout + proc.stderr
    rows = {r["check"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    unexplained = [r for r in rows.values() if r["result"] == "SKIP" and not r["detail"]]
    failed = [r for r in rows.values() if r["result"] == "FAIL"]
    assert not failed, shown
    assert not unexplained, shown
    assert proc.returncode == 0, shown
    assert "CHECK" in proc.stdout
    assert rows["pytest -m gpu"]["result"] == "SKIP"
    for agent in ("GFD labels", "device plugin + Allocate", "exporter scrape", "CDI spec"):
        assert rows[agent]["result"] == "PASS", shown
    for listing in ("MIG profiles (-lgip)", "MIG GPU instances (-lgi)"):
        assert rows[listing]["result"] == ("PASS" if mig else "SKIP"), shown
    assert rows["non-root discovery"]["result"] == ("PASS" if _nonroot_runs() else "SKIP")
    for artefact in ("nvidia-smi-L.txt", "gfd-labels.txt", "metrics.txt", "device-plugin.json"):
        assert (tmp_path / artefact).stat().st_size > 0, artefact
