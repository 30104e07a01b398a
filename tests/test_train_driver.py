"""The training driver's sampler: every epoch a permutation of the examples, a new one each epoch,
the same on a rerun (resume draws the batches an uninterrupted run would); and its choice of the
train dtype `auto` on both host classes."""
import pytest

from specdec.train.driver import batch_indices, epoch_order


def test_every_epoch_visits_each_example_once_in_a_new_order():
    n, bs = 10, 4
    stream = [i for step in range(15) for i in batch_indices(step, bs, n, seed=3)]   # 6 epochs
    epochs = [stream[e * n:(e + 1) * n] for e in range(6)]
    assert all(sorted(e) == list(range(n)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 6          # reshuffled every epoch
    assert epochs[0] == epoch_order(n, 0, 3) and epochs[1] == epoch_order(n, 1, 3)


def test_batches_are_a_function_of_the_step_and_the_seed():
    assert batch_indices(7, 4, 10, seed=0) == batch_indices(7, 4, 10, seed=0)
    assert batch_indices(7, 4, 10, seed=0) != batch_indices(7, 4, 10, seed=1)
    assert len(batch_indices(2, 4, 10, seed=0)) == 4      # a batch across an epoch boundary is full


# the train dtype `auto`: the speed dtype, unless fp32 trains clearly faster (the host faked)

def _host(monkeypatch, native_bf16: bool):
    from specdec import host
    monkeypatch.setattr(host, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"} if native_bf16 else {"avx2"})
    monkeypatch.setattr(host, "isa_level", lambda: "AVX512" if native_bf16 else "AVX2")


def _timings(monkeypatch, per_dtype: dict):
    from specdec.train import driver
    seen = []

    def fake(method, target, data, settings, tcfg, device):
        seen.append(tcfg.dtype)
        return per_dtype[tcfg.dtype]
    monkeypatch.setattr(driver, "_seconds_per_step", fake)
    return seen


def test_auto_train_dtype_on_an_avx2_host_is_fp32_without_a_probe(monkeypatch):
    from specdec.train import driver, loop
    _host(monkeypatch, native_bf16=False)
    seen = _timings(monkeypatch, {})
    dtype, why = driver.choose_dtype(None, None, None, {}, loop.TrainConfig(dtype="auto"), "cpu")
    assert (dtype, seen) == ("float32", []) and "no native bf16" in why


@pytest.mark.parametrize("bf16_s, fp32_s, want", [(1.0, 0.6, "float32"), (1.0, 0.95, "bfloat16"),
                                                  (1.0, 1.4, "bfloat16")])
def test_auto_train_dtype_on_a_bf16_host_is_the_faster_one(monkeypatch, bf16_s, fp32_s, want):
    from specdec.train import driver, loop
    _host(monkeypatch, native_bf16=True)
    seen = _timings(monkeypatch, {"bfloat16": bf16_s, "float32": fp32_s})
    dtype, why = driver.choose_dtype(None, None, None, {}, loop.TrainConfig(dtype="auto"), "cpu")
    assert dtype == want and sorted(seen) == ["bfloat16", "float32"]
    assert f"bfloat16 {bf16_s:.2f} s/step, float32 {fp32_s:.2f} s/step" in why
