"""What an inference costs (issue 54): the meters on recorded copies of real sysfs trees (this VM has none), a
counter's wrap-around, the idle draw subtracted, CPU time where no meter exists, and the objectives end to end."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from autodeploy.harness import energy
from autodeploy.harness.energy import Cost, CostMeter, Counter, Integrated, Meters, find, idle_watts
from autodeploy.harness.timing import TimingPolicy, time_calls
from autodeploy.objectives import of
from autodeploy.report import SCHEMA
from tests.cli.test_cli import env, run  # noqa: F401 - env is a fixture

#: ``grep . /sys/class/powercap/*/{name,energy_uj,max_energy_range_uj}`` of an Intel laptop (Linux 6.x), as read:
#: the control type's own folder (no counter), package 0 with its core, uncore and DRAM zones, psys, and the MMIO
#: copy of package 0 (the same counter through another interface: never read twice).
RAPL_LAPTOP = (
    ("intel-rapl", None, None, None),
    ("intel-rapl:0", "package-0", 58843243164, 262143328850),
    ("intel-rapl:0:0", "core", 23117540712, 262143328850),
    ("intel-rapl:0:1", "uncore", 1180361627, 262143328850),
    ("intel-rapl:0:2", "dram", 9310728390, 65712999613),
    ("intel-rapl:1", "psys", 120556114808, 262143328850),
    ("intel-rapl-mmio:0", "package-0", 58843241870, 262143328850),
)


def _recorded_sysfs(root: Path, zones=RAPL_LAPTOP) -> Path:
    """``root`` as ``/sys/class`` with the recorded powercap zones written into it."""
    for folder, name, energy_uj, max_uj in zones:
        zone = root / "powercap" / folder
        zone.mkdir(parents=True)
        (zone / "enabled").write_text("1\n")
        if name is not None:
            (zone / "name").write_text(f"{name}\n")
            (zone / "energy_uj").write_text(f"{energy_uj}\n")
            (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return root


def _set(root: Path, zone: str, energy_uj: int) -> None:
    (root / "powercap" / zone / "energy_uj").write_text(f"{energy_uj}\n")


def test_the_powercap_reader_on_a_recorded_copy_of_a_laptop_s_sysfs_tree(tmp_path):
    meters = find(_recorded_sysfs(tmp_path), nvml=False)
    sources = [c.source for c in meters.counters]
    assert sources == ["powercap intel-rapl:0 package-0", "powercap intel-rapl:0:0 core",
                       "powercap intel-rapl:0:1 uncore", "powercap intel-rapl:0:2 dram",
                       "powercap intel-rapl:1 psys"]  # fmt: skip
    # package and DRAM are summed; core and uncore lie inside the package, psys over it: recorded, not added
    assert [c.source for c in meters.counters if c.counted] == [sources[0], sources[3]] and meters.metered
    assert meters.counters[0].read() == pytest.approx(58843.243164)  # joules
    assert meters.absent == (f"no {tmp_path / 'hwmon'}",)


def test_a_counter_that_wraps_at_its_max_energy_range_is_undone_over_the_timed_phase(tmp_path):
    """A package counter 1 J before its wrap (262143.328850 J) reads 2.5 J after it: the phase drew 3.5 J."""
    root = _recorded_sysfs(tmp_path, (("intel-rapl:0", "package-0", 262142328850, 262143328850),))
    meters = find(root, nvml=False)
    clock = iter([0.0, 2.0])
    spent = CostMeter(meters, cpu=lambda: 0.0, clock=lambda: next(clock))
    _set(root, "intel-rapl:0", 2_500_000)
    cost = spent.stop(calls=100)
    assert cost.readings[0].joules == pytest.approx(3.5) and cost.energy_mj == pytest.approx(35.0)
    counter = meters.counters[0]
    assert counter.since(10.0, 12.0) == 2.0 and counter.since(262143.0, 1.0) == pytest.approx(1.32885)


def test_the_idle_draw_measured_before_is_subtracted_for_the_phase_s_wall_time(tmp_path):
    root = _recorded_sysfs(tmp_path, (("intel-rapl:0", "package-0", 1_000_000, 262143328850),
                                      ("intel-rapl:0:2", "dram", 1_000_000, 65712999613)))  # fmt: skip
    meters = find(root, nvml=False)
    clock = iter([0.0, 1.0])  # idle: 1 s, the package drew 4 J (4 W), the DRAM 1 J (1 W)

    def sleep(_seconds: float) -> None:
        _set(root, "intel-rapl:0", 5_000_000)
        _set(root, "intel-rapl:0:2", 2_000_000)

    idle = idle_watts(meters.counters, sleep=sleep, clock=lambda: next(clock))
    assert idle == {"powercap intel-rapl:0 package-0": pytest.approx(4.0),
                    "powercap intel-rapl:0:2 dram": pytest.approx(1.0)}  # fmt: skip
    ticks, cpu = iter([10.0, 12.0]), iter([3.0, 3.4])
    spent = CostMeter(meters, idle, cpu=lambda: next(cpu), clock=lambda: next(ticks))
    _set(root, "intel-rapl:0", 25_000_000)  # 20 J over 2 s: 12 J above the idle 8 J
    _set(root, "intel-rapl:0:2", 5_000_000)  # 3 J over 2 s: 1 J above the idle 2 J
    cost = spent.stop(calls=50).per_item(2)  # 100 inferences
    assert cost.items == 100 and cost.energy_mj == pytest.approx(130.0) and cost.cpu_ms == pytest.approx(4.0)
    assert cost.source == "powercap intel-rapl:0 package-0 + powercap intel-rapl:0:2 dram"
    assert cost.text() == ("energy 130.0 mJ per inference (powercap intel-rapl:0 package-0 + powercap "
                           "intel-rapl:0:2 dram, idle draw subtracted), CPU time 4.000 ms per inference")  # fmt: skip
    below = Cost(1, 1, 2.0, 0.1, (energy.Reading("x", 1.0, idle_w=1.0),))  # under idle: noise, not negative
    assert below.energy_mj == 0.0


def test_without_a_meter_it_says_why_and_gives_cpu_time_never_called_energy(tmp_path, monkeypatch):
    monkeypatch.setattr(energy, "nvml_gpus", lambda: ([], "NVML: nvidia-ml-py is not installed"))
    meters = find(tmp_path)
    assert not meters.metered and meters.counters == ()
    assert meters.why_none() == (f"no energy meter here: no {tmp_path / 'powercap'}; NVML: nvidia-ml-py is not "
                                 f"installed; no {tmp_path / 'hwmon'}")  # fmt: skip
    timed = time_calls(lambda: sum(range(2000)), TimingPolicy(warmup_min_calls=1, warmup_max_s=0, min_samples=20,
                                                              min_duration_s=0.0), meters=meters)  # fmt: skip
    cost = timed.cost
    assert cost is not None and cost.calls == len(timed.samples_ns) and cost.readings == ()
    assert cost.energy_mj is None and cost.cpu_s > 0 and cost.cpu_ms is not None
    assert cost.text().startswith("CPU time ") and "per inference (no energy meter here: " in cost.text()
    assert "energy " not in cost.text().split("(")[0]


def test_powercap_readable_by_root_only_says_so(tmp_path, monkeypatch):
    root = _recorded_sysfs(tmp_path, (("intel-rapl:0", "package-0", 1, 262143328850),))

    def refuse(self, *args, **kwargs):
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return original(self, *args, **kwargs)

    original = Path.read_text
    monkeypatch.setattr(Path, "read_text", refuse)
    counters, why = energy.powercap(root / "powercap")
    assert counters == [] and "readable by root only" in why and "chmod o+r" in why


def test_hwmon_sensors_on_a_recorded_copy_of_a_board_s_tree(tmp_path):
    """An INA226 power sensor (µW) and an amd_energy counter (µJ): each named by chip and label; the board's first
    sensor is summed only where no RAPL zone or GPU measures."""
    ina = tmp_path / "hwmon" / "hwmon0"
    ina.mkdir(parents=True)
    (ina / "name").write_text("ina226\n")
    (ina / "power1_input").write_text("2040000\n")
    (ina / "power1_label").write_text("VDD_IN\n")
    amd = tmp_path / "hwmon" / "hwmon1"
    amd.mkdir()
    (amd / "name").write_text("amd_energy\n")
    (amd / "energy1_input").write_text("5000000\n")
    (amd / "energy1_label").write_text("Esocket0\n")
    meters = find(tmp_path, nvml=False)
    assert [(c.source, c.counted) for c in meters.counters] == [("hwmon hwmon0 ina226 VDD_IN", True),
                                                                ("hwmon hwmon1 amd_energy Esocket0", False)]  # fmt: skip
    assert meters.counters[1].read() == 5.0
    meters.close()
    with_rapl = find(_recorded_sysfs(tmp_path), nvml=False)
    assert not any(c.counted for c in with_rapl.counters if c.source.startswith("hwmon"))
    with_rapl.close()


def test_a_power_sensor_is_integrated_into_energy():
    watts, ticks = iter([2.0, 4.0, 4.0]), iter([0.0, 1.0, 3.0])
    power = Integrated(lambda: next(watts), clock=lambda: next(ticks), interval=3600.0)  # no tick of its own
    assert power.joules() == 0.0 and power.joules() == pytest.approx(3.0)  # (2 + 4) / 2 x 1 s
    assert power.joules() == pytest.approx(11.0)  # + 4 W x 2 s
    power.close()


def test_the_cost_round_trips_and_each_kind_of_counter_is_read_once():
    fake = Counter("NVML GPU 0 H100", lambda: 1.0)
    assert fake.since(1.0, 0.5) == -0.5  # NVML never wraps: a drop is reported as it is, not folded
    cost = Cost(3, 6, 1.0, 0.3, (energy.Reading("NVML GPU 0 H100", 6.0, idle_w=1.0),))
    assert Cost.from_dict(json.loads(json.dumps(cost.to_dict()))) == cost
    assert cost.to_dict()["energy_mj_per_inference"] == pytest.approx(5e3 / 6)
    assert Meters().why_none() == "no energy meter here: none found"


@pytest.mark.skipif(not any(Path("/sys/class/powercap").glob("intel-rapl:*")), reason="no powercap zone")
def test_the_real_powercap_tree_where_one_exists():
    meters = find(nvml=False)
    if not meters.metered:
        pytest.skip(meters.why_none())
    before = [c.read() for c in meters.counters]
    assert all(b >= 0 for b in before) and all(c.source.startswith("powercap") for c in meters.counters[:1])


def test_objective_energy_is_refused_in_one_line_without_a_meter(env, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setattr(energy, "SYSFS", env[0] / "sys")
    monkeypatch.setattr(energy, "nvml_gpus", lambda: ([], "NVML: nvidia-ml-py is not installed"))
    code, out, err = run(capsys, "tune", "zoo:tiny-cnn", "--objective", "energy", "--trials", "2")
    assert code == 2 and out == ""
    line = " ".join(err.split())
    assert "objective 'energy' needs an energy meter and this machine has none (no energy meter here:" in line
    assert "fix: --objective cpu-time" in line


def test_objective_cpu_time_tunes_zoo_tiny_cnn_and_bench_shows_it(env, capsys):  # noqa: F811
    fast = ["--engine", "onnxruntime", "--precision", "fp32", "--threads", "1", "--min-samples", "64",
            "--min-duration", "0.05"]  # fmt: skip
    code, out, err = run(capsys, "tune", "zoo:tiny-cnn", "--objective", "cpu-time", "--trials", "2", "--name", "c",
                         "--format", "json", *fast)  # fmt: skip
    assert code == 0, err
    record = json.loads(out)
    jsonschema.validate(record, SCHEMA, cls=jsonschema.Draft202012Validator)
    assert record["statistic"] == of("cpu-time").statistic and record["statistic_unit"] == "ms"
    assert record["winner"]["statistic"] > 0 and "CPU time per inference" in record["headline"]
    code, out, _ = run(capsys, "results", "list", "--format", "json")
    trials = json.loads(out)
    jsonschema.validate(trials[0], SCHEMA, cls=jsonschema.Draft202012Validator)
    cost = trials[0]["measurement"]["cost"]
    assert cost["cpu_ms_per_inference"] > 0 and cost["energy_mj_per_inference"] is None and cost["no_meter"]
    code, out, err = run(capsys, "bench", "zoo:tiny-cnn", *fast)
    assert code == 0, err
    shown = " ".join(out.split())
    assert "cost per inference" in shown and "CPU time" in shown and "no energy meter here" in shown
