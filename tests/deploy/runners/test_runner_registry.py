"""bnnexport.deploy.runners: the registry (names, errors, a runner of one's own), what `auto`
picks, and bench's device rows calling nothing but the protocol. No device: fake clients and
runners."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from bnnexport.deploy.errors import UnknownRunnerError
from bnnexport.deploy.runners import (
    Measurement,
    RunSettings,
    candidates,
    check_runner,
    get_runner,
    pick_runner,
    register_runner,
    runner_choices,
    runner_names,
    unregister_runner,
)

from bnnexport.stages.bench.device import (
    Connected,
    Scoring,
    device_rows,
    file_device_rows,
    needs_batched_copy,
    scaling_rows,
)
from bnnexport.stages.bench.options import BenchOptions, DeviceTarget


@dataclasses.dataclass
class FakeClient:
    """A device whose Python imports LCE or not; `asked` counts the commands it was sent."""

    has_lce: bool = True
    destination: str = "me@fake"
    asked: int = 0

    def run(self, command, **kwargs):
        self.asked += 1
        return type("Done", (), {"returncode": 0 if self.has_lce else 1, "stdout": ""})()


class FakeRunner:
    """A runner of a test's own: latency from its `threads`, outputs of twice the inputs."""

    profiles = False
    batched_copy = False
    can_run = True

    def __init__(self):
        self.calls = []
        self.layouts = []  # the input layout of the samples each `measure` was given

    def available(self, client, settings):
        return self.can_run

    def preflight(self, machine, settings):
        self.calls.append(("preflight", machine))

    def measure(self, client, flatbuffer, settings, samples):
        self.calls.append(("measure", settings.threads))
        self.layouts.append(samples.input_layout)
        outputs = 2 * samples.inputs.reshape(len(samples.inputs), -1)
        return Measurement({"min": float(settings.threads)}, {"threads": settings.threads}, outputs)

    def latency(self, client, flatbuffer, settings, samples):
        self.calls.append(("latency", settings.threads))
        return Measurement({"min": float(settings.threads)}, {"threads": settings.threads})


@pytest.fixture
def own_runner():
    """A FakeRunner registered as `fake` (after the built-in ones) for one test, then removed."""
    register_runner("fake")(FakeRunner)
    yield get_runner("fake")
    unregister_runner("fake")


def test_the_built_in_runners_in_registry_order():
    assert runner_names() == ["python", "lce_benchmark_model"]
    assert runner_names(profiles=True) == ["lce_benchmark_model"]
    assert runner_choices() == ["auto", "python", "lce_benchmark_model"]


def test_an_unknown_runner_is_a_specific_error_naming_the_choices():
    with pytest.raises(UnknownRunnerError) as raised:
        get_runner("tflite")
    assert str(raised.value) == (
        "unknown runner 'tflite'; choose from auto, python, lce_benchmark_model"
    )
    assert raised.value.exit_code == 2  # the CLI's one-line error
    with pytest.raises(UnknownRunnerError, match="choose from auto, python"):
        DeviceTarget("pi@raspberrypi.local", runner="tflite")


def test_a_registered_runner_is_selectable_until_unregistered(own_runner):
    assert runner_names()[-1] == "fake" and "fake" in runner_choices()
    assert DeviceTarget("me@fake", runner="fake").runner == "fake"
    assert pick_runner("fake", FakeClient(), RunSettings()) is own_runner
    unregister_runner("fake")
    with pytest.raises(UnknownRunnerError, match="choose from auto, python, lce_benchmark_model$"):
        get_runner("fake")


def test_auto_picks_python_where_the_device_can_run_it():
    assert pick_runner("auto", FakeClient(has_lce=True), RunSettings()).name == "python"


def test_auto_falls_back_to_lce_benchmark_model():
    runner = pick_runner("auto", FakeClient(has_lce=False), RunSettings())
    assert runner.name == "lce_benchmark_model"


def test_auto_with_a_profile_picks_a_runner_that_profiles_without_asking_python():
    client = FakeClient(has_lce=True)
    assert pick_runner("auto", client, RunSettings(), profile=True).name == "lce_benchmark_model"
    assert client.asked == 0


def test_registry_order_decides_auto(own_runner):
    register_runner("fake", order=0)(FakeRunner)
    assert pick_runner("auto", FakeClient(has_lce=True), RunSettings()).name == "fake"
    get_runner("fake").can_run = False  # the device cannot run it: the next one in order
    assert pick_runner("auto", FakeClient(has_lce=True), RunSettings()).name == "python"


def test_a_profile_needs_a_runner_that_profiles(own_runner):
    with pytest.raises(ValueError) as raised:
        check_runner("python", profile=True)
    assert str(raised.value) == (
        "profile needs the lce_benchmark_model runner (the python runner has no op profiler)"
    )
    with pytest.raises(ValueError, match="the fake runner has no op profiler"):
        DeviceTarget("me@fake", runner="fake", profile=True)
    check_runner("auto", profile=True)
    assert [r.name for r in candidates("auto", profile=True)] == ["lce_benchmark_model"]


def test_the_batched_copy_is_needed_where_the_runner_may_need_it(own_runner):
    assert needs_batched_copy(DeviceTarget("pi@raspberrypi.local"))  # auto may pick the tool
    assert needs_batched_copy(DeviceTarget("pi@raspberrypi.local", runner="lce_benchmark_model"))
    assert not needs_batched_copy(DeviceTarget("pi@raspberrypi.local", runner="python"))
    assert not needs_batched_copy(DeviceTarget("me@fake", runner="fake"))


def _scoring() -> Scoring:
    inputs = np.arange(12, dtype=np.float32).reshape(3, 1, 2, 2)
    reference = 2 * inputs.reshape(3, -1)
    return Scoring(inputs, np.array([3, 3, 3]), reference, host_lce=reference)


def test_bench_rows_come_from_the_protocol_of_a_runner_of_ones_own(own_runner, tiny_flatbuffer):
    """(The flatbuffer only declares an input layout here: the fake runner never runs it.)"""
    device = DeviceTarget("me@fake", runner="fake")
    options = BenchOptions(threads=2, scaling_threads=(1, 4))
    connected = Connected(FakeClient(), {}, own_runner, tiny_flatbuffer)
    rows, raw = device_rows(connected, device, options, _scoring())
    # outputs from the flatbuffer itself: scored against PyTorch, no `lce vs host lce` row
    assert [(r.name, r.where, r.top1, r.argmax_agreement) for r in rows] == [
        ("lce", "me@fake", 1.0, 1.0)
    ]
    assert raw is None and "note" not in rows[0].extra
    scaled = scaling_rows(connected, device, options, _scoring())
    assert [(r.name, r.latency_ms["min"], r.samples) for r in scaled] == [
        ("lce (1 threads)", 1.0, 0),
        ("lce (4 threads)", 4.0, 0),
    ]
    assert own_runner.calls == [("measure", 2), ("latency", 1), ("latency", 4)]
    assert own_runner.layouts == ["nhwc"]  # what the flatbuffer declares, for the runner
    first = file_device_rows(connected, device, options, _scoring())[0]
    assert (first.name, first.latency_ms["min"], "note" in first.extra) == ("lce", 2.0, False)
