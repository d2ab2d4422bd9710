"""What the catalog and the shipped profiles say, held to what is true: every machine boots an
image whose NVIDIA driver can drive its GPU (issue 64: Azure's HPC image moved to the open kernel
modules, which cannot drive a V100, while the ND40rs_v2 profile still booted it), and each
profile's comment prices the cluster as `plan` does."""

from __future__ import annotations

import pytest

from sortie.infra.catalog import CATALOG
from sortie.infra.cloud_facts import GPU_MODELS, ImageDriver, driver_problem
from sortie.stacks.cloud.stack_api import spec_from_config
from sortie.stacks.profiles import load_profile, profile_names

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_every_machines_default_image_drives_its_gpu(name: str):
    machine = CATALOG[name]
    assert machine.gpu_model in GPU_MODELS, "each GPU in the table, with its driver branches"
    assert driver_problem(machine.gpu_model, machine.driver) is None, machine.image


@pytest.mark.parametrize("profile", profile_names())
def test_every_shipped_profile_boots_an_image_that_drives_its_gpu(profile: str):
    spec = spec_from_config(profile, load_profile(profile))
    assert spec.image is None or spec.image == spec.instance.image, "the catalog's image"
    assert driver_problem(spec.instance.gpu_model, spec.instance.driver) is None


def test_the_table_refuses_what_nvidia_says_cannot_work():
    open_any = ImageDriver("open", None, "test")
    assert "proprietary kernel modules" in driver_problem("V100", open_any)
    assert "proprietary kernel modules" in driver_problem("V100", ImageDriver("unstated", 570, "t"))
    assert driver_problem("V100", ImageDriver("proprietary", 580, "t")) is None
    assert "up to driver branch 580" in driver_problem("V100", ImageDriver("proprietary", 590, "t"))
    assert driver_problem("A100", open_any) is None
    assert "450 or newer" in driver_problem("A100", ImageDriver("proprietary", 440, "t"))
    assert "not in the GPU table" in driver_problem("K80", open_any)


def test_the_azure_v100_machine_boots_the_v100_build_of_the_hpc_image():
    assert CATALOG["Standard_ND40rs_v2"].image == "microsoft-dsvm:ubuntu-hpc:2204-v100:latest"
    assert CATALOG["Standard_ND96asr_v4"].image == "microsoft-dsvm:ubuntu-hpc:2204:latest"


@pytest.mark.parametrize("profile", profile_names())
def test_each_profiles_comment_says_what_plan_prices(profile: str):
    """Issue 64: profile comments quoted spot figures of an older catalog ($6.61/h for a
    Standard_ND40rs_v2 that `plan` prices at $2.42)."""
    import re

    from sortie.infra.spec import estimate_cost
    from sortie.stacks.profiles import profile_path

    spec = spec_from_config(profile, load_profile(profile))
    cost = estimate_cost(spec)
    header = "".join(line for line in profile_path(profile).read_text().splitlines(True)
                     if line.startswith("#"))
    said = [float(figure) for figure in re.findall(r"\$([\d.]+)/h", header)]
    assert said, "the comment says what the cluster costs"
    for figure in said:
        assert any(abs(figure - usd) <= 0.051 for usd in (cost.on_demand_usd_h,
                                                          cost.spot_usd_h)), (figure, cost)


HOPPER = ("p5.48xlarge", "p5en.48xlarge", "a3-highgpu-8g", "a3-megagpu-8g",
          "Standard_ND96isr_H100_v5", "Standard_ND96isr_H200_v5")


def test_the_gpus_people_rent_in_2026_are_in_the_catalog_on_every_cloud():
    """Issue 69: `plan --gpu H100:8 --nodes 2` answered "nothing in the catalog fits"."""
    from sortie.infra.offers import not_built, offers

    hopper = sorted(name for name, kind in CATALOG.items() if kind.gpu_model in ("H100", "H200"))
    assert hopper == sorted(HOPPER)
    for name in HOPPER:
        kind = CATALOG[name]
        assert kind.gpus == 8 and kind.interconnect, name  # each with its fabric
        assert kind.reference_region in kind.regional, f"{name}: a dated price of its own"
        assert driver_problem(kind.gpu_model, kind.driver) is None
    assert {o.cloud for o in offers("H100:8", 2)} == {"aws", "gcp", "azure"}
    assert {o.cloud for o in offers("H200:8", 2)} == {"aws", "azure"}
    # what is not built is said, with why
    assert {name for _, name, _ in not_built("H200:8")} == {"p5e.48xlarge", "a3-ultragpu-8g"}
    # the fabrics' interfaces, as the providers' references count them
    assert (CATALOG["p5.48xlarge"].network_cards, CATALOG["p5en.48xlarge"].network_cards) == \
        (32, 16)
    assert (CATALOG["a3-highgpu-8g"].network_cards, CATALOG["a3-megagpu-8g"].network_cards) == \
        (4, 8)


def test_a_profile_naming_a_machine_sortie_does_not_build_is_refused_with_why():
    from sortie.core.errors import UsageError

    config = load_profile("gcp-a2")
    config["sortie:instanceType"] = "a3-ultragpu-8g"
    with pytest.raises(UsageError, match="a3-ultragpu-8g is not built by sortie yet: A3 Ultra"):
        spec_from_config("gcp-a2", config)


def test_a_machine_two_clouds_name_is_refused(monkeypatch: pytest.MonkeyPatch):
    """Found adding a toy cloud by the change guide (issue 65 (6)): a copy of GCP's machines
    under a new cloud hid GCP's own (the catalog is by name), and `plan --stack gcp-a2` said
    "not in the catalog for gcp". Now the catalog refuses the second name, saying both clouds."""
    from sortie.infra import catalog
    from sortie.infra.clouds import facts as real

    class Twin:
        instance_types = real("gcp").instance_types

    monkeypatch.setattr(catalog, "CLOUDS", ("gcp", "twin"))
    monkeypatch.setattr(catalog, "facts", lambda cloud: Twin if cloud == "twin" else real(cloud))
    with pytest.raises(ValueError, match=r"in both gcp's and twin's facts"):
        catalog._by_name()
