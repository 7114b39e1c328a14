"""What a local cluster gives each island's process: GPUs or TPU chips of its own, and the
C allocator's settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from pathways_nb.deploy._accelerators import island_envs, nvidia_gpus, spare_the_hosts_gpus
from pathways_nb.deploy._tpus import tpu_chips, tpu_island_envs


def _driver(tmp_path: Path, count: int) -> str:
    """A stand-in for /proc/driver/nvidia/gpus: one entry per GPU, named by PCI bus."""
    d = tmp_path / "gpus"
    d.mkdir()
    for i in range(count):
        (d / f"0000:{i:02x}:00.0").mkdir()
    return str(d)


def test_the_gpus_a_process_may_use(tmp_path: Path) -> None:
    eight = _driver(tmp_path, 8)
    assert nvidia_gpus({}, eight) == [str(i) for i in range(8)]
    assert nvidia_gpus({}, str(tmp_path / "no-driver")) == []
    # CUDA_VISIBLE_DEVICES decides when set: indices or UUIDs, up to an invalid entry.
    assert nvidia_gpus({"CUDA_VISIBLE_DEVICES": "4, 5,6"}, eight) == ["4", "5", "6"]
    assert nvidia_gpus({"CUDA_VISIBLE_DEVICES": "GPU-a1,GPU-b2"}, eight) == ["GPU-a1", "GPU-b2"]
    assert nvidia_gpus({"CUDA_VISIBLE_DEVICES": "2,-1,3"}, eight) == ["2"]
    assert nvidia_gpus({"CUDA_VISIBLE_DEVICES": ""}, eight) == []


def test_islands_get_disjoint_runs_of_gpus_or_a_clear_refusal(tmp_path: Path) -> None:
    eight = _driver(tmp_path, 8)
    envs = island_envs(None, 3, 2, {}, eight)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "2,3", "4,5"]
    envs = island_envs("cuda", 2, 1, {"CUDA_VISIBLE_DEVICES": "6,7"}, eight)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["6", "7"]
    with pytest.raises(ValueError, match=r"3 islands of 4 devices need 12 GPUs.*shows 8"):
        island_envs(None, 3, 4, {}, eight)
    # Simulated devices, another platform, or no GPUs to share: nothing to add.
    assert island_envs("cpu", 2, 4, {}, eight) == [{}, {}]
    no_tpu = str(tmp_path / "no-pci")
    assert island_envs(None, 2, 4, {}, eight, pci_dir=no_tpu)[0] == {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3"
    }
    with pytest.raises(ValueError, match=r"platform='tpu' asks for TPU chips.*sees none"):
        island_envs("tpu", 2, 4, {}, eight, pci_dir=no_tpu)
    assert island_envs(None, 2, 4, {}, str(tmp_path / "no-driver")) == [{}, {}]
    with pytest.raises(ValueError, match=r"platform='cuda' asks for NVIDIA GPUs.*sees none"):
        island_envs("cuda", 1, 1, {"CUDA_VISIBLE_DEVICES": "-1"}, eight)


def _kfd(tmp_path: Path, gpus: int, cpus: int = 2) -> str:
    """A stand-in for the AMD driver's topology: CPU nodes (gpu_id 0) and GPU nodes."""
    d = tmp_path / "kfd"
    for n in range(cpus + gpus):
        node = d / str(n)
        node.mkdir(parents=True)
        (node / "gpu_id").write_text("0\n" if n < cpus else f"{1000 + n}\n")
    return str(d)


def test_amd_gpus_are_shared_out_through_the_variable_rocm_reads(tmp_path: Path) -> None:
    four = _kfd(tmp_path, 4)
    none = str(tmp_path / "no-nvidia")
    envs = island_envs(None, 2, 2, {}, none, four)
    assert envs == [{"ROCR_VISIBLE_DEVICES": "0,1"}, {"ROCR_VISIBLE_DEVICES": "2,3"}]
    assert island_envs("rocm", 2, 1, {}, none, four) == [
        {"ROCR_VISIBLE_DEVICES": "0"},
        {"ROCR_VISIBLE_DEVICES": "1"},
    ]
    # Within the GPUs the process was given: HIP_VISIBLE_DEVICES numbers those that
    # ROCR_VISIBLE_DEVICES leaves, so it is the one split when set.
    given = {"ROCR_VISIBLE_DEVICES": "1,2,3", "HIP_VISIBLE_DEVICES": "0,2"}
    assert island_envs("gpu", 2, 1, given, none, four) == [
        {"HIP_VISIBLE_DEVICES": "0"},
        {"HIP_VISIBLE_DEVICES": "2"},
    ]
    assert island_envs("rocm", 1, 2, {"ROCR_VISIBLE_DEVICES": "GPU-a,GPU-b"}, none, four) == [
        {"ROCR_VISIBLE_DEVICES": "GPU-a,GPU-b"}
    ]
    with pytest.raises(ValueError, match=r"need 6 GPUs, and this machine shows 4 AMD GPUs"):
        island_envs("rocm", 3, 2, {}, none, four)
    # CPU nodes alone are no GPUs; NVIDIA's are not AMD's, nor the other way round.
    cpus_only = _kfd(tmp_path / "cpus", 0)
    assert island_envs(None, 2, 2, {}, none, cpus_only) == [{}, {}]
    with pytest.raises(ValueError, match=r"platform='rocm' asks for AMD GPUs.*sees none"):
        island_envs("rocm", 1, 1, {}, _driver(tmp_path, 8), cpus_only)
    with pytest.raises(ValueError, match=r"platform='cuda' asks for NVIDIA GPUs.*sees none"):
        island_envs("cuda", 1, 1, {}, none, four)


def test_the_client_process_leaves_the_hosts_gpus_alone(tmp_path: Path) -> None:
    eight = _driver(tmp_path, 8)
    envs = island_envs(None, 2, 4, {}, eight)
    # JAX here has not started on a GPU: it will start without taking memory ahead.
    environ: dict[str, str] = {}
    assert spare_the_hosts_gpus(envs, environ, gpu_in_use=False) is None
    assert environ == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    # What the user set stays as it is.
    environ = {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
    spare_the_hosts_gpus(envs, environ, gpu_in_use=False)
    assert environ == {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
    # It has: nothing can be undone here, so the warning says what to do.
    warning = spare_the_hosts_gpus(envs, {}, gpu_in_use=True)
    assert warning is not None and "JAX_PLATFORMS=cpu" in warning
    # Hosts on simulated devices take no GPUs: nothing to spare.
    environ = {}
    cpu = island_envs("cpu", 2, 4, {}, eight)
    assert spare_the_hosts_gpus(cpu, environ, gpu_in_use=True) is None and environ == {}


def _pci(tmp_path: Path, chips: int, device: str = "0x0063") -> str:
    """A stand-in for /sys/bus/pci/devices: a NIC and ``chips`` Google TPU functions."""
    d = tmp_path / "pci"
    functions = {"0000:00:04.0": ("0x1af4", "0x1000")}
    functions |= {f"0000:00:{5 + i:02x}.0": ("0x1ae0", device) for i in range(chips)}
    for name, (vendor, dev) in functions.items():
        (d / name).mkdir(parents=True)
        (d / name / "vendor").write_text(vendor + "\n")
        (d / name / "device").write_text(dev + "\n")
    return str(d)


def test_islands_get_blocks_of_tpu_chips_with_the_runtimes_variables(tmp_path: Path) -> None:
    pci, none = _pci(tmp_path, 8), str(tmp_path / "no-gpus")
    chips = tpu_chips({}, pci)
    assert chips is not None and (chips.generation, chips.names) == (
        "v5e",
        [str(i) for i in range(8)],
    )
    envs = island_envs(None, 4, 2, {}, none, none, pci)
    assert [e["TPU_VISIBLE_CHIPS"] for e in envs] == ["0,1", "2,3", "4,5", "6,7"]
    assert {e["TPU_CHIPS_PER_PROCESS_BOUNDS"] for e in envs} == {"1,2,1"}
    assert {e["TPU_PROCESS_BOUNDS"] for e in envs} == {"1,1,1"}
    assert all(e["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1" for e in envs)
    # Each host's runtime coordinates on a port of its own, or the second one waits.
    ports = [e["TPU_PROCESS_PORT"] for e in envs]
    assert len(set(ports)) == 4
    assert [e["TPU_PROCESS_ADDRESSES"] for e in envs] == [f"localhost:{p}" for p in ports]
    four = tpu_island_envs(chips, 2, 4, lambda n: [8476 + i for i in range(n)])
    assert [(e["TPU_VISIBLE_CHIPS"], e["TPU_CHIPS_PER_PROCESS_BOUNDS"]) for e in four] == [
        ("0,1,2,3", "2,2,1"),
        ("4,5,6,7", "2,2,1"),
    ]
    # One island of every chip is the runtime's default: nothing to set.
    assert island_envs("tpu", 1, 8, {}, none, none, pci) == [{}]
    # Within the chips the process was given.
    given = island_envs("tpu", 2, 1, {"TPU_VISIBLE_CHIPS": "6,7"}, none, none, pci)
    assert [e["TPU_VISIBLE_CHIPS"] for e in given] == ["6", "7"]
    with pytest.raises(ValueError, match=r"need 12 TPU chips, and this machine shows 8 TPU v5e"):
        island_envs(None, 3, 4, {}, none, none, pci)
    with pytest.raises(ValueError, match=r"1, 2, 4 or 8 chips.*got devices_per_island=3"):
        island_envs(None, 2, 3, {}, none, none, pci)
    # Simulated devices leave the chips alone.
    assert island_envs("cpu", 2, 4, {}, none, none, pci) == [{}, {}]
    # Google's network card and disks on a GPU machine in its cloud are no TPUs.
    gce = _pci(tmp_path / "gce", 2, device="0x0042")
    assert tpu_chips({}, gce) is None
    gpus = island_envs(None, 2, 1, {}, _driver(tmp_path / "gce", 2), none, gce)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in gpus] == ["0", "1"]


def test_tpu_chips_of_a_generation_not_known_here_are_not_shared_out(tmp_path: Path) -> None:
    pci, none = _pci(tmp_path, 4, device="0x0027"), str(tmp_path / "no-gpus")
    with pytest.raises(ValueError, match=r"PCI device ids 0x0027.*islands=1, devices_per_island=4"):
        island_envs(None, 2, 2, {}, none, none, pci)
    assert island_envs(None, 1, 4, {}, none, none, pci) == [{}]


def test_the_client_is_warned_when_it_holds_the_hosts_tpu_chips(tmp_path: Path) -> None:
    none = str(tmp_path / "no-gpus")
    envs = island_envs(None, 2, 2, {}, none, none, _pci(tmp_path, 4, device="0x005e"))
    warning = spare_the_hosts_gpus(envs, {}, gpu_in_use=False, tpu_in_use=True)
    assert warning is not None and "JAX_PLATFORMS=cpu" in warning and "TPU chips" in warning
    environ: dict[str, str] = {}
    assert spare_the_hosts_gpus(envs, environ, gpu_in_use=False) is None and environ == {}


def test_hosts_ask_glibc_for_huge_pages_unless_told_otherwise() -> None:
    from pathways_nb.deploy._malloc import with_huge_pages

    assert with_huge_pages(None) == with_huge_pages("") == "glibc.malloc.hugetlb=1"
    mine = "glibc.malloc.arena_max=2"
    assert with_huge_pages(mine) == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert with_huge_pages("glibc.malloc.hugetlb=0") == "glibc.malloc.hugetlb=0"
