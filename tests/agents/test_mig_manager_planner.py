"""The planner as "state in, plan out": placement search, per-GPU plans and `assert` on the GPU
models the mock knows, the hardware-generated configs, and the operator's default ConfigMap."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import pytest

from gpu_operator.agents.mig_manager import config as cfg
from gpu_operator.agents.mig_manager import generate, layout, planner, profiles
from gpu_operator.agents.mig_manager.planner import GpuState
from gpu_operator.nvml import catalog
from gpu_operator.nvml.catalog import Placement
from gpu_operator.operands import mig_configs
from gpu_operator.operands import mig_manager as mig_operand

A100_40 = catalog.model("A100-SXM4-40GB")
A100_80 = catalog.model("A100-SXM4-80GB")
H100 = catalog.model("H100-SXM5-80GB")
H200 = catalog.model("H200-141GB")
B200 = catalog.model("B200")
A30 = catalog.model("A30-24GB")
T4 = catalog.model("T4")


def want(**counts: int) -> dict[profiles.Profile, int]:
    return {profiles.parse(k.replace("_", ".").replace("plus", "+")): n for k, n in counts.items()}


def wanted(spec: Mapping[str, int]) -> dict[profiles.Profile, int]:
    return {profiles.parse(k): n for k, n in spec.items()}


def placements(result: layout.Layout) -> list[tuple[str, int, int]]:
    return [(gi.profile.name, gi.placement.start, gi.placement.size) for gi in result]


def gpu(
    model: catalog.GpuModel,
    index: int = 0,
    devices: Mapping[str, int] | None = None,
    *,
    pending: bool | None = None,
) -> GpuState:
    """A GPU as NVML would report it: MIG on with `devices` placed, or off when None."""
    if devices is None:
        return GpuState(index, model, False, bool(pending), (), model.pci_device_id)
    placed = layout.place(model, wanted(devices))
    with_ids = tuple(
        layout.GpuInstance(gi.profile, gi.placement, gi.compute, id=i + 1)
        for i, gi in enumerate(placed)
    )
    on = True if pending is None else pending
    return GpuState(index, model, True, on, with_ids, model.pci_device_id)


# -- placement search -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "spec", "expected"),
    [
        (A100_40, {"1g.5gb": 7}, [("1g.5gb", s, 1) for s in range(7)]),
        (A100_40, {"4g.20gb": 1, "3g.20gb": 1}, [("4g.20gb", 0, 4), ("3g.20gb", 4, 4)]),
        (A100_40, {"3g.20gb": 2}, [("3g.20gb", 0, 4), ("3g.20gb", 4, 4)]),
        (
            A100_40,
            {"2g.10gb": 3, "1g.5gb": 1},
            [("2g.10gb", 0, 2), ("2g.10gb", 2, 2), ("2g.10gb", 4, 2), ("1g.5gb", 6, 1)],
        ),
        (
            A100_40,
            {"4g.20gb": 1, "2g.10gb": 1, "1g.5gb": 1},
            [("4g.20gb", 0, 4), ("2g.10gb", 4, 2), ("1g.5gb", 6, 1)],
        ),
        (A100_40, {"1g.10gb": 4}, [("1g.10gb", s, 2) for s in (0, 2, 4, 6)]),
        (A100_80, {"7g.80gb": 1}, [("7g.80gb", 0, 8)]),
        (
            H100,
            {"3g.40gb": 1, "2g.20gb": 2},
            [("3g.40gb", 4, 4), ("2g.20gb", 0, 2), ("2g.20gb", 2, 2)],
        ),
        (H200, {"1g.18gb": 7}, [("1g.18gb", s, 1) for s in range(7)]),
        (B200, {"4g.90gb": 1, "3g.90gb": 1}, [("4g.90gb", 0, 4), ("3g.90gb", 4, 4)]),
        (A30, {"2g.12gb": 1, "1g.6gb": 2}, [("2g.12gb", 0, 2), ("1g.6gb", 2, 1), ("1g.6gb", 3, 1)]),
        (A30, {"4g.24gb": 1}, [("4g.24gb", 0, 4)]),
    ],
)
def test_placement_search_finds_a_layout_largest_first(
    model: catalog.GpuModel, spec: dict[str, int], expected: list[tuple[str, int, int]]
) -> None:
    result = layout.place(model, wanted(spec))
    assert sorted(placements(result)) == sorted(expected)
    assert layout.counts(result) == spec


def test_order_that_would_fail_first_free_is_still_placed() -> None:
    # NVML's first free 3g placement is 0, which blocks a 4g; placing 4g first works.
    result = layout.place(A100_40, wanted({"3g.20gb": 1, "4g.20gb": 1}))
    assert sorted(placements(result)) == [("3g.20gb", 4, 4), ("4g.20gb", 0, 4)]


def test_split_profiles_share_a_gpu_instance() -> None:
    result = layout.place(A100_40, wanted({"1c.7g.40gb": 3, "4c.7g.40gb": 1}))
    (gi,) = result
    assert gi.profile.name == "7g.40gb"
    assert sorted((ci.slices, ci.placement.start) for ci in gi.compute) == [
        (1, 4),
        (1, 5),
        (1, 6),
        (4, 0),
    ]
    assert layout.counts(result) == {"1c.7g.40gb": 3, "4c.7g.40gb": 1}


def test_split_profiles_spill_into_a_second_instance_when_one_is_full() -> None:
    result = layout.place(A100_40, wanted({"1c.3g.20gb": 4}))
    assert [len(gi.compute) for gi in result] == [3, 1]
    assert sorted(placements(result)) == [("3g.20gb", 0, 4), ("3g.20gb", 4, 4)]


@pytest.mark.parametrize(
    ("model", "spec", "message"),
    [
        (A100_40, {"1g.5gb": 8}, "A100-SXM4-40GB holds at most 7 1g.5gb GPU instance(s)"),
        (A100_40, {"7g.40gb": 1, "1g.5gb": 1}, "needs 8 compute slices; A100-SXM4-40GB has 7"),
        (A100_40, {"4g.20gb": 1, "3g.20gb": 1, "1g.5gb": 1}, "needs 8 compute slices"),
        (A100_40, {"1g.5gb+me": 2}, "at most 1 1g.5gb+me GPU instance(s)"),
        (A30, {"1g.6gb+me": 1, "2g.12gb+me": 1}, "only one +me GPU instance can own the media"),
        # 7 compute slices, but two 3g instances take all 8 memory slices.
        (
            A100_40,
            {"3g.20gb": 2, "1g.5gb": 1},
            "cannot be placed together on A100-SXM4-40GB: every arrangement",
        ),
        (A100_40, {"1g.10gb": 4, "1g.5gb": 1}, "every arrangement of their GPU instances"),
        (A100_40, {"1c.7g.40gb": 8}, "at most 1 7g.40gb GPU instance(s)"),
    ],
)
def test_impossible_layouts_say_why(
    model: catalog.GpuModel, spec: dict[str, int], message: str
) -> None:
    with pytest.raises(layout.PlacementError) as info:
        layout.place(model, wanted(spec))
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("model", "name", "message"),
    [
        (A100_40, "1g.10gb+me", "A100-SXM4-40GB has no MIG profile '1g.10gb+me'"),
        (H100, "1g.5gb", "H100-SXM5-80GB has no MIG profile '1g.5gb'; its profiles are 1g.10gb"),
        (A30, "3g.12gb", "A30-24GB has no MIG profile '3g.12gb'"),
        (A100_40, "3c.4g.20gb", "no MIG profile '3c.4g.20gb'"),
        (T4, "1g.5gb", "T4 is not MIG capable"),
    ],
)
def test_unknown_profiles_name_what_the_gpu_has(
    model: catalog.GpuModel, name: str, message: str
) -> None:
    with pytest.raises(profiles.ProfileError) as info:
        layout.place(model, wanted({name: 1}))
    assert message in str(info.value)


def test_every_valid_layout_is_found() -> None:
    """Against brute force: every multiset of whole profiles some placement holds is placed."""
    model = A100_40
    found: set[tuple[tuple[str, int], ...]] = set()

    def walk(start: int, taken: list[Placement], chosen: list[catalog.MigProfile]) -> None:
        found.add(tuple(sorted(Counter(p.name for p in chosen).items())))
        for i in range(start, len(model.mig_profiles)):
            profile = model.mig_profiles[i]
            for pl in profile.placements:
                if any(pl.overlaps(t) for t in taken):
                    continue
                candidate = [*chosen, profile]
                if sum(p.slice_count for p in candidate) > model.mig_compute_slices:
                    continue
                if sum(1 for p in candidate if p is profile) > profile.instance_count:
                    continue
                if sum(1 for p in candidate if p.media_extensions) > 1:
                    continue
                walk(i, [*taken, pl], candidate)

    walk(0, [], [])
    assert len(found) > 50
    for combo in found:
        if combo:
            assert layout.counts(layout.place(model, wanted(dict(combo)))) == dict(combo)


# -- per-GPU plans and assert -----------------------------------------------------------------


def entries(doc: str, name: str) -> tuple[cfg.Entry, ...]:
    return cfg.loads(doc).select(name)


ALL_1G = """
version: v1
mig-configs:
  all-disabled: [{devices: all, mig-enabled: false}]
  all-1g.5gb: [{devices: all, mig-enabled: true, mig-devices: {"1g.5gb": 7}}]
  half:
    - {devices: [0, 1], mig-enabled: false}
    - {devices: [2, 3], mig-enabled: true, mig-devices: {"3g.20gb": 2}}
  t4-explicit: [{devices: [1], mig-enabled: true, mig-devices: {"1g.5gb": 1}}]
  h100-only:
    - {device-filter: "0x233010DE", devices: all, mig-enabled: true, mig-devices: {"7g.80gb": 1}}
"""


def test_enabling_mig_sets_the_mode_resets_and_creates() -> None:
    plan = planner.plan_node("all-1g.5gb", entries(ALL_1G, "all-1g.5gb"), [gpu(A100_40)])
    (p,) = plan.gpus
    assert (p.changes, p.set_mode, p.needs_reset) == (True, True, True)
    assert p.target_devices == {"1g.5gb": 7}
    assert p.destroy == ()
    assert plan.mode_change
    assert not plan.applied
    assert p.summary() == (
        "GPU 0 (A100-SXM4-40GB): MIG off -> MIG on, 1g.5gb x7 (mode change: GPU reset)"
    )


def test_an_already_applied_config_changes_nothing() -> None:
    gpus = [gpu(A100_40, i, {"1g.5gb": 7}) for i in range(8)]
    plan = planner.plan_node("all-1g.5gb", entries(ALL_1G, "all-1g.5gb"), gpus)
    assert plan.applied
    assert not plan.mode_change
    assert plan.gpus[0].summary() == "GPU 0 (A100-SXM4-40GB): MIG on, 1g.5gb x7, unchanged"


def test_changing_devices_destroys_and_recreates_without_a_reset() -> None:
    current = gpu(A100_40, devices={"3g.20gb": 2})
    plan = planner.plan_node("all-1g.5gb", entries(ALL_1G, "all-1g.5gb"), [current])
    (p,) = plan.gpus
    assert p.destroy == current.instances
    assert (p.set_mode, p.needs_reset) == (None, False)
    assert not plan.mode_change


def test_disabling_mig_destroys_instances_and_resets() -> None:
    current = gpu(H100, devices={"7g.80gb": 1})
    (p,) = planner.plan_node("all-disabled", entries(ALL_1G, "all-disabled"), [current]).gpus
    assert (p.destroy, p.set_mode, p.needs_reset) == (current.instances, False, True)
    assert p.target == ()


def test_a_pending_mode_still_counts_as_not_applied() -> None:
    pending = gpu(A100_40, pending=True)
    (p,) = planner.plan_node("all-disabled", entries(ALL_1G, "all-disabled"), [pending]).gpus
    assert (p.changes, p.set_mode, p.needs_reset) == (True, False, False)


def test_only_gpus_whose_layout_differs_are_touched() -> None:
    gpus = [
        gpu(A100_40, 0),
        gpu(A100_40, 1, {"1g.5gb": 7}),
        gpu(A100_40, 2, {"3g.20gb": 2}),
        gpu(A100_40, 3, {"1g.5gb": 7}),
    ]
    plan = planner.plan_node("half", entries(ALL_1G, "half"), gpus)
    assert [p.index for p in plan.changed] == [1, 3]
    assert [p.needs_reset for p in plan.changed] == [True, False]


def test_devices_all_skips_gpus_without_mig_but_naming_one_is_an_error() -> None:
    mixed = [gpu(A100_40, 0), GpuState(1, T4, pci_device_id=T4.pci_device_id)]
    plan = planner.plan_node("all-1g.5gb", entries(ALL_1G, "all-1g.5gb"), mixed)
    assert [p.index for p in plan.gpus] == [0]
    with pytest.raises(planner.PlanError) as info:
        planner.plan_node("t4-explicit", entries(ALL_1G, "t4-explicit"), mixed)
    assert str(info.value) == "mig-configs.t4-explicit[0]: GPU 1 (T4) is not MIG capable"


def test_device_filters_pick_gpus_by_model_on_a_mixed_node() -> None:
    node = [gpu(A100_40, 0), gpu(H100, 1)]
    plan = planner.plan_node("h100-only", entries(ALL_1G, "h100-only"), node)
    assert [(p.index, p.target_devices) for p in plan.gpus] == [(1, {"7g.80gb": 1})]


def test_plan_errors_name_the_config_entry_and_gpu() -> None:
    with pytest.raises(planner.PlanError) as info:
        planner.plan_node("all-1g.5gb", entries(ALL_1G, "all-1g.5gb"), [gpu(H100, 3)])
    assert str(info.value).startswith(
        "mig-configs.all-1g.5gb[0]: GPU 3 (H100-SXM5-80GB): H100-SXM5-80GB has no MIG profile"
    )


def test_restore_plan_returns_each_gpu_to_its_exact_previous_layout() -> None:
    before = [gpu(A100_40, 0, {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}), gpu(A100_40, 1)]
    after = [gpu(A100_40, 0, {"1g.5gb": 7}), gpu(A100_40, 1, {"1g.5gb": 7})]
    plan = planner.plan_restore(before, after)
    assert [p.target for p in plan.gpus] == [before[0].instances, ()]
    assert [p.target_enabled for p in plan.gpus] == [True, False]
    assert planner.verify(plan, before) == []
    assert planner.verify(plan, after) == [
        "GPU 0: has 1g.5gb x7, expected 3g.20gb x1, 2g.10gb x1, 1g.5gb x2",
        "GPU 1: MIG mode is not disabled",
    ]


# -- generated configs and the operator's default ConfigMap -----------------------------------


def _by_model(
    doc: cfg.MigConfigFile, model: catalog.GpuModel, names: Iterable[str] | None = None
) -> dict[str, dict[str, int]]:
    """Config name -> the devices it gives a GPU of `model` (configs that skip it: absent)."""
    out = {}
    for name in doc.configs if names is None else names:
        plan = planner.plan_node(name, doc.select(name), [gpu(model)])
        if plan.gpus:
            out[name] = plan.gpus[0].target_devices
    return out


DEFAULT = cfg.loads(mig_operand.default_mig_config_yaml(), "default-mig-parted-config")


# A GB200 as earlier drivers sized it: upstream's all-1g.24gb asks for 4 (the double-memory 1g
# of H100 NVL) where the board has 7 whole-slice 1g.24gb, and upstream's all-balanced entry for
# its PCI id names the profiles current drivers report (1g.23gb, ...).
KNOWN_DIVERGENCES = {("GB200-189GB", "all-1g.24gb"), ("GB200-189GB", "all-balanced")}


@pytest.mark.parametrize("model", catalog.mig_capable_models(), ids=lambda m: m.key)
def test_generated_config_agrees_with_the_default_config_map(model: catalog.GpuModel) -> None:
    """The hardware-generated config and upstream's configs meant for this model match."""
    generated = cfg.parse(generate.generate([model, model]), "generated")
    ours = _by_model(generated, model)
    meant = {c.name for c in mig_configs.CONFIGS if model.key in c.targets}
    theirs = _by_model(DEFAULT, model, meant)
    skip = {name for key, name in KNOWN_DIVERGENCES if key == model.key}
    assert set(ours) - skip == set(theirs) - skip
    for name in set(ours) - skip:
        assert ours[name] == theirs[name], name


def test_generated_config_filters_by_device_only_on_mixed_nodes() -> None:
    single = generate.generate([A100_40] * 8)
    assert "device-filter" not in single["mig-configs"]["all-1g.5gb"][0]
    mixed = generate.generate([A100_40, H100, T4])
    assert mixed["mig-configs"]["all-balanced"] == [
        {
            "device-filter": ["0x20B010DE"],
            "devices": "all",
            "mig-enabled": True,
            "mig-devices": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
        },
        {
            "device-filter": ["0x233010DE"],
            "devices": "all",
            "mig-enabled": True,
            "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
        },
    ]
    text = generate.to_yaml(mixed)
    assert text.startswith("# DO NOT EDIT")
    assert cfg.loads(text).select("all-1g.10gb")  # both models have a 1g.10gb


def test_summaries_group_gpus_with_the_same_change() -> None:
    gpus = [gpu(A100_40, i) for i in range(4)] + [gpu(A100_40, 4, {"1g.5gb": 7}), gpu(A100_40, 6)]
    plan = planner.plan_node("all-1g.5gb", entries(ALL_1G, "all-1g.5gb"), gpus)
    assert planner.summarize(plan.gpus) == (
        "GPUs 0-3, 6 (A100-SXM4-40GB): MIG off -> MIG on, 1g.5gb x7 (mode change: GPU reset); "
        "GPU 4 (A100-SXM4-40GB): MIG on, 1g.5gb x7, unchanged"
    )


def _entries(text: str) -> tuple[cfg.Entry, ...]:
    return cfg.loads("version: v1\nmig-configs:\n  c:\n" + text).select("c")


@pytest.mark.parametrize(
    ("devices", "gpus", "message"),
    [
        ("[0, 99]", range(8), "GPU index 99 does not exist: this node has 8 GPUs (indices 0-7)"),
        ("[8]", range(8), "GPU index 8 does not exist: this node has 8 GPUs (indices 0-7)"),
        ("[9, 2, 12]", range(2), "GPU indices 2, 9, 12 do not exist: this node has 2 GPUs"),
        ("[0]", range(0), "GPU index 0 does not exist: this node has no GPUs"),
        ("[1]", (0, 2, 3), "GPU index 1 does not exist: this node has 3 GPUs (indices 0, 2-3)"),
    ],
)
def test_an_index_the_node_lacks_fails_the_plan_naming_it_and_the_gpu_count(
    devices: str, gpus: Iterable[int], message: str
) -> None:
    # mig-parted skips such an index and applies the rest; here nothing is applied.
    entries = _entries(f"  - {{devices: {devices}, mig-enabled: false}}\n")
    with pytest.raises(planner.PlanError) as err:
        planner.plan_node("c", entries, [gpu(A100_40, i) for i in gpus])
    assert str(err.value).startswith(f"mig-configs.c[0].devices: {message}")


def test_an_index_the_node_lacks_fails_even_with_a_filter_that_leaves_it_out() -> None:
    entries = _entries(
        '  - {devices: all, mig-enabled: true, mig-devices: {"1g.5gb": 7}}\n'
        "  - {devices: [1, 3], device-filter: 0x20B010DE, mig-enabled: false}\n"
    )
    nodes = [gpu(A100_40, 0), gpu(A100_40, 1)]
    with pytest.raises(planner.PlanError, match=r"mig-configs\.c\[1\]\.devices: GPU index 3 "):
        planner.plan_node("c", entries, nodes)
    ok = planner.plan_node("c", entries[:1], nodes)
    assert [p.index for p in ok.gpus] == [0, 1]
