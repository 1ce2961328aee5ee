"""summaries.Progress: steps/s and the ETA count training steps only."""
from prompt_jax.train import summaries


class FakeClock:

  def __init__(self):
    self.now = 0.0

  def __call__(self) -> float:
    return self.now


def test_rate_leaves_out_start_up_and_evaluations():
  clock = FakeClock()
  progress = summaries.Progress(0, 100, 8, clock=clock)
  clock.now += 50.0  # evaluation before training
  clock.now += 80.0  # the first step, compile included
  progress.start(1)
  clock.now += 9.0  # steps 2..10, 1 s each
  line = progress.line(10, {"loss": 1.5, "accuracy": 0.25}, 0.3)
  assert line == ("step 10/100 loss 1.5000 accuracy 0.250 lr 0.3 1.00 steps/s 8.0 examples/s "
                  "ETA 00:01:30")
  assert summaries.Progress.timing(progress.steps_per_sec, 8) == {
      "timing/steps_per_second": 1.0, "timing/examples_per_second": 8.0}
  clock.now += 100.0  # evaluation at step 10
  progress.start(10)
  clock.now += 5.0  # steps 11..20, 0.5 s each
  assert progress.line(20, {"loss": 1.0}, 0.3).endswith(
      "2.00 steps/s 16.0 examples/s ETA 00:00:40")
  assert progress.steps_per_sec == 2.0


def test_no_rate_before_a_step_is_timed():
  clock = FakeClock()
  progress = summaries.Progress(0, 100, 8, clock=clock)
  clock.now += 60.0
  progress.start(1)  # the first step is also a stats step (STATS_PERIOD 1)
  line = progress.line(1, {"loss": 2.0}, 0.1)
  assert line.endswith("lr 0.1 ? steps/s ? examples/s ETA ?")
  assert progress.steps_per_sec is None
  assert not summaries.Progress.timing(progress.steps_per_sec, 8)
  clock.now += 4.0
  assert progress.line(3, {"loss": 2.0}, 0.1).endswith("0.50 steps/s 4.0 examples/s ETA 00:03:14")
