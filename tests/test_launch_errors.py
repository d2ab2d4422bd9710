"""Which launch errors move a launch on to its next placement (capacity) and which stop it
(quota, permission, image), in each cloud's own words (issue 64)."""

from __future__ import annotations

import pytest

from sortie.stacks.cloud.sites import launch_error

pytestmark = pytest.mark.unit


def test_each_clouds_capacity_errors_move_on_and_the_rest_stop():
    capacity = {
        "aws": ["api error InsufficientInstanceCapacity: We currently do not have sufficient "
                "p4d.24xlarge capacity in the Availability Zone you requested (us-east-1a)",
                "api error Unsupported: Your requested instance type (p4d.24xlarge) is not "
                "supported in your requested Availability Zone (us-east-1e)"],
        "gcp": ["googleapi: Error 503: The zone 'projects/p/zones/us-central1-a' does not have "
                "enough resources available to fulfill the request., "
                "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"],
        "azure": ["Code=\"ZonalAllocationFailed\" Message=\"Allocation failed.\"",
                  "Code=\"SkuNotAvailable\" Message=\"The requested VM size for resource "
                  "Standard_ND96asr_v4 is currently not available in location 'eastus' zones "
                  "'2'\"", "Code=\"OverconstrainedAllocationRequest\""],
    }
    stops = {
        "aws": ["api error MaxSpotInstanceCountExceeded: Max spot instance count exceeded"],
        "gcp": ["googleapi: Error 403: Quota 'NVIDIA_A100_GPUS' exceeded.  Limit: 0.0 in "
                "region us-central1., quotaExceeded",
                "googleapi: Error 403: Required 'compute.instances.create' permission for "
                "'projects/p/zones/us-central1-a/instances/node-0', forbidden",
                "googleapi: Error 404: The resource 'projects/deeplearning-platform-release/"
                "global/images/family/pytorch-x' was not found, notFound"],
        "azure": ["Code=\"OperationNotAllowed\" Message=\"Operation could not be completed as "
                  "it results in exceeding approved standardNDSv2Family Cores quota.\"",
                  "Code=\"AuthorizationFailed\" Message=\"The client 'x' does not have "
                  "authorization to perform action 'Microsoft.Compute/virtualMachines/write'\"",
                  "Code=\"PlatformImageNotFound\""],
    }
    for cloud, messages in capacity.items():
        assert all(launch_error(cloud, m).moves_on for m in messages), cloud
    for cloud, messages in stops.items():
        for message in messages:
            error = launch_error(cloud, message)
            assert not error.moves_on and str(error).endswith(message), (cloud, message)
    # An error no rule names stops too (a retry in another zone would meet it again).
    assert not launch_error("aws", "creating EC2 VPC: something new").moves_on
