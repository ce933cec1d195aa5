"""The DRA driver's node label stays while pods hold gpu.nvidia.com claims there (pure)."""

from __future__ import annotations

from gpu_operator.controller.gpucluster import node_label_patch
from gpu_operator.operands import dra_driver
from gpu_operator.status.gpucluster import ClaimPod, nodes_holding_gpu_claims

DRA = dra_driver.DEPLOY_DRA_DRIVER
LABELLED = dict.fromkeys(dra_driver.DEPLOY_LABELS, "true") | {"nvidia.com/gpu.present": "true"}


def test_running_and_terminating_claim_pods_hold_their_node() -> None:
    pods = [
        ClaimPod("a", "ml", ("train-gpu",), ended=False),  # running or terminating
        ClaimPod("b", "ml", ("done-gpu",), ended=True),  # Succeeded: holds nothing
        ClaimPod("c", "ml", (), ended=False),  # no claim
        ClaimPod("d", "ml", ("fpga",), ended=False),  # a claim of another driver
        ClaimPod("e", "ml", ("unseen",), ended=False),  # a claim not seen yet counts
    ]
    claims = {"ml/train-gpu": True, "ml/done-gpu": True, "ml/fpga": False}
    assert nodes_holding_gpu_claims(pods, claims) == {"a", "e"}
    # Claims not readable: every pod with a claim counts.
    assert nodes_holding_gpu_claims(pods, None) == {"a", "d", "e"}


def test_the_dra_driver_label_stays_while_claims_are_held() -> None:
    # The GPUCluster went (wanted False): every DRA label goes, except the driver's where
    # claim pods remain; the plugin must stay to unprepare their claims.
    kept = node_label_patch(LABELLED, wanted=False, holds_claims=True)
    assert kept == {label: None for label in dra_driver.DEPLOY_LABELS if label != DRA}
    gone = node_label_patch(LABELLED, wanted=False, holds_claims=False)
    assert gone is not None
    assert gone[DRA] is None
    # Never added back to a node that lost it.
    without = {k: v for k, v in LABELLED.items() if k != DRA}
    patch = node_label_patch(without, wanted=False, holds_claims=True)
    assert patch is not None
    assert DRA not in patch
    # A node no longer a GPU node (GPUCluster still there) keeps it too while claims are held.
    no_gpu = {k: v for k, v in LABELLED.items() if k != "nvidia.com/gpu.present"}
    patch = node_label_patch(no_gpu, wanted=True, holds_claims=True)
    assert patch is not None
    assert DRA not in patch
