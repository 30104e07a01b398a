"""The training driver's sampler: every epoch a permutation of the examples, a new one each epoch,
the same on a rerun (resume draws the batches an uninterrupted run would)."""
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
