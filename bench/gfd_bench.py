"""GFD label computation time on an 8-GPU MIG machine (target <= 20 ms), against a trivial baseline.

Run: .venv/bin/python bench/gfd_bench.py [--rounds N]
Prints the median of the pure label function, of fact collection from the mock, and of the whole
oneshot pass; the ratio is against building a dict of the same size (the floor for any labeller).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.gfd import facts as gfd_facts
from gpu_operator.agents.gfd import labels as gfd_labels
from gpu_operator.nvml import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
import history  # bench/history.py, next to this script: runs append their figures there


def median_ms(fn: Callable[[], object], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()

    machine = mock.MockMachine.from_preset("dgx-a100-mig-mixed")
    lib = machine.nvml()
    lib.init()
    config = pc.parse(
        {
            "flags": {"migStrategy": "mixed"},
            "sharing": {"timeSlicing": {"resources": [{"name": "mig-1g.5gb", "replicas": 4}]}},
        }
    )
    options = gfd_labels.LabelOptions(timestamp=int(time.time()))
    facts = gfd_facts.collect(lib, machine_type="NVIDIA DGX A100")
    labels = gfd_labels.compute_labels(facts, config, options)
    items = list(labels.items())

    def baseline() -> object:
        return dict(items)

    def pure() -> object:
        return gfd_labels.compute_labels(facts, config, options)

    def collect() -> gfd_facts.NodeFacts:
        return gfd_facts.collect(lib, machine_type="NVIDIA DGX A100")

    def whole() -> object:
        return gfd_labels.render(gfd_labels.compute_labels(collect(), config, options))

    base_ms = median_ms(baseline, args.rounds)
    pure_ms = median_ms(pure, args.rounds)
    collect_ms = median_ms(collect, args.rounds)
    whole_ms = median_ms(whole, args.rounds)
    gpus = len(facts.gpus)
    migs = sum(len(g.mig_devices) for g in facts.gpus)
    print(f"machine: dgx-a100-mig-mixed ({gpus} GPUs, {migs} MIG devices), {len(labels)} labels")
    print(f"label computation (pure):   {pure_ms:8.3f} ms  (target <= 20 ms)")
    print(f"fact collection (mock NVML): {collect_ms:7.3f} ms")
    print(f"oneshot pass (collect+label+render): {whole_ms:.3f} ms")
    print(f"baseline dict of {len(labels)} labels: {base_ms * 1000:.1f} us; "
          f"label computation = {pure_ms / base_ms:.0f}x baseline")  # fmt: skip
    figures = {"labels_ms": pure_ms, "collect_ms": collect_ms, "oneshot_ms": whole_ms}
    history.append("gfd", figures, config={"rounds": args.rounds})


if __name__ == "__main__":
    main()
