"""The TRL internals the adapter reaches into (retool_adapters.trl.internals): a TRL release that changes their shape
fails here, by name, rather than degrading training silently; and each fallback keeps training correct."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

trl = pytest.importorskip("trl", reason="the TRL adapter needs TRL (the train extra)")

from retool_adapters.trl import internals  # noqa: E402
from retool_adapters.trl.rollout import _colocated_engine  # noqa: E402


def test_the_installed_trl_is_the_one_checked_and_has_the_shape_the_adapter_reads():
    assert trl.__version__ == internals.CHECKED_TRL_VERSION, (
        f"TRL {trl.__version__}: check retool_adapters/trl/internals.py against it, then update CHECKED_TRL_VERSION")
    assert internals.shape_changes() == []


def test_a_changed_trl_is_named_by_what_changed(monkeypatch):
    from trl import GRPOTrainer
    from trl.generation.vllm_generation import VLLMGeneration

    monkeypatch.delattr(GRPOTrainer, "_log_metric")
    monkeypatch.delattr(VLLMGeneration, "sync_weights")
    changes = internals.shape_changes()
    assert len(changes) == 2 and "_log_metric" in changes[0] and "sync_weights" in changes[1]


def test_without_log_metric_the_metrics_are_dropped_with_one_warning():
    logged = []
    internals.log_metric(SimpleNamespace(_log_metric=lambda name, value: logged.append((name, value))), "m", 1.0)
    assert logged == [("m", 1.0)]
    internals._warn_once.cache_clear()
    with pytest.warns(RuntimeWarning, match="_log_metric is gone"):
        internals.log_metric(SimpleNamespace(), "m", 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        internals.log_metric(SimpleNamespace(), "m", 2.0)  # once per process, not once per metric


def test_an_engine_that_no_longer_says_whether_it_slept_gets_the_weights_again():
    class Engine:
        def wake_up(self, tags):
            pass

        def sleep(self, level):
            pass

    pushes = []
    vllm_generation = SimpleNamespace(tensor_parallel_size=1, enable_sleep_mode=True, llm=Engine(),
                                      sync_weights=lambda: pushes.append(1))  # no _llm_weights_sleeping
    with _colocated_engine(SimpleNamespace(vllm_generation=vllm_generation)):
        pass
    assert pushes == [1] and internals.engine_weights_asleep(vllm_generation)
